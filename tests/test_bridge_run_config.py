"""Megatron-Bridge saves: the model config comes from ``run_config.yaml``, so a Bridge Gemma save converts to HF.

Megatron-Bridge writes no ``args`` into ``common.pt``; the model provider's fields (zero-centred norms
included) live only in the ``run_config.yaml`` it writes into each iteration dir. The fixture is laid out as
Bridge's ``save_checkpoint`` lays it out (``src/megatron/bridge/training/checkpointing.py``, rank 0's
``train_state_finalize_fn``; ``training/utils/checkpoint_utils.py`` for the names):

* ``iter_0000010/``: megatron-core's ``dist_checkpointing.save`` (real megatron-core, gloo world of 1) of the
  model's sharded tensors plus ``checkpoint_version`` and ``iteration`` (Bridge's ``generate_state_dict``;
  no ``args``), ``train_state.pt`` (``TrainState.state_dict()``: int64/float64/bool scalar tensors) and
  ``run_config.yaml``;
* the root: ``latest_train_state.pt`` (a copy) and ``latest_checkpointed_iteration.txt``.

``run_config.yaml`` is written as ``ConfigContainer.to_yaml`` writes it: ``yaml.safe_dump(to_dict(),
default_flow_style=False)``, where ``to_dict`` turns each dataclass into a mapping with a ``_target_`` class
path and the representers of ``utils/yaml_utils.py`` turn functions and dtypes into ``{_target_, _call_:
false}`` and enums into ``{_target_, _call_: true, _args_, _name_}``. The model section holds a
``Gemma3ModelProvider``'s fields (``models/gemma/gemma3_provider.py``). Bridge itself is not installed
here (it needs TransformerEngine), hence the hand-built dict; its values come from the HF config.

The tensors are a transformers-written Gemma 3 under Megatron names (ckptscope's own conversion gives the
names and values, read back with torch DCP and saved again by megatron-core). The judge is transformers:
the Bridge save converted to HF gives bitwise the original logits.
"""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
yaml = pytest.importorskip("yaml")
pytest.importorskip("megatron.core")

from tests.arch_roundtrip import convert, eager_logits  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.mcore_reference import generators  # noqa: E402

DIMS = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, sliding_window=5, max_position_embeddings=64,
            query_pre_attn_scalar=20, layer_types=["sliding_attention", "full_attention"])
TOKENS = torch.tensor([[5, 17, 299, 3, 42, 7, 128, 250, 9, 1, 77, 12], [2, 8, 19, 150, 298, 4, 60, 33, 5, 91, 6, 0]])
ITERATION = 10
ITER_DIR = f"iter_{ITERATION:07d}"
PWNED = "ckptscope_run_config_must_not_run_this"
"""A file a ``_target_`` in the run config names as a command; reading the config must never create it."""


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Gemma3TextConfig(**DIMS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # HF initialises them to 0 (= scale 1): a lost or added 1.0 must show
                param.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp("gemma3") / "hf"
    model.save_pretrained(out)
    return out


def _stored_tensors(dist_iter_dir) -> dict:
    """Every tensor of a torch_dist dir, read by torch's own DCP loader."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(dist_iter_dir)).read_metadata()
    state = {key: torch.empty(tuple(md.size), dtype=md.properties.dtype)
             for key, md in metadata.state_dict_metadata.items() if hasattr(md, "size")}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(dist_iter_dir)), no_dist=True)
    return state


def _model_section(hf_config: dict, **change) -> dict:
    """A ``Gemma3ModelProvider`` as ``to_dict`` serialises it (the fields a GPT provider records)."""
    section = {
        "_target_": "megatron.bridge.models.gemma.gemma3_provider.Gemma3ModelProvider",
        "num_layers": hf_config["num_hidden_layers"], "hidden_size": hf_config["hidden_size"],
        "ffn_hidden_size": hf_config["intermediate_size"], "num_attention_heads": hf_config["num_attention_heads"],
        "num_query_groups": hf_config["num_key_value_heads"], "kv_channels": hf_config["head_dim"],
        "vocab_size": hf_config["vocab_size"], "make_vocab_size_divisible_by": 128, "should_pad_vocab": False,
        "seq_length": hf_config["max_position_embeddings"], "share_embeddings_and_output_weights": True,
        "normalization": "RMSNorm", "layernorm_zero_centered_gamma": True,
        "layernorm_epsilon": hf_config["rms_norm_eps"], "qk_layernorm": True, "add_qkv_bias": False,
        "add_bias_linear": False, "gated_linear_unit": True, "position_embedding_type": "rope",
        "rotary_base": [10000, 1000000], "rotary_percent": 1.0, "window_size": hf_config["sliding_window"],
        "interleaved_attn_pattern": [1, 1], "softmax_scale": 0.2236, "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1, "bf16": False, "fp16": False, "num_moe_experts": None,
        "activation_func": {"_target_": "megatron.core.activations.fast_gelu", "_call_": False},
        "params_dtype": {"_target_": "torch.float32", "_call_": False},
        "attention_backend": {"_target_": "megatron.core.transformer.enums.AttnBackend", "_call_": True,
                              "_args_": [1], "_name_": "flash"},
        "transformer_layer_spec": {"_target_": "megatron.bridge.models.gemma.gemma3_provider.gemma3_layer_spec",
                                   "_call_": False},
    }
    section.update(change)
    return section


def _run_config(hf_config: dict, root, **change) -> dict:
    return {
        "_target_": "megatron.bridge.training.config.ConfigContainer",
        "model": _model_section(hf_config, **change),
        "checkpoint": {"_target_": "megatron.bridge.training.config.CheckpointConfig", "save": str(root),
                       "save_interval": ITERATION, "ckpt_format": "torch_dist", "save_optim": False,
                       "save_rng": False, "fully_parallel_save": True, "async_save": False},
        "train": {"_target_": "megatron.bridge.training.config.TrainingConfig", "train_iters": ITERATION,
                  "global_batch_size": 2, "micro_batch_size": 1},
        # Nothing may instantiate a _target_: this one would create a file if anything did.
        "logger": {"_target_": "os.system", "_call_": True, "_args_": [f"touch {PWNED}"]},
    }


def _write_bridge_save(root, hf_dir, tmp_path, **change):
    """A Megatron-Bridge save root of the Gemma 3 in ``hf_dir`` (see the module docstring)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    names = convert(hf_dir, tmp_path / "names", to="mcore") / "iter_0000000"
    tensors = _stored_tensors(names)
    iter_dir = root / ITER_DIR
    iter_dir.mkdir(parents=True)
    state = {key: ShardedTensor.from_rank_offsets(key, value, replica_id=0) for key, value in tensors.items()}
    state.update(checkpoint_version=3.0, iteration=ITERATION)
    gen = generators()
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        dist_checkpointing.save(state, str(iter_dir))
    train_state = {"step": torch.tensor(ITERATION), "consumed_train_samples": torch.tensor(20),
                   "skipped_train_samples": torch.tensor(0), "consumed_valid_samples": torch.tensor(0),
                   "floating_point_operations_so_far": torch.tensor(1.5e9, dtype=torch.float64),
                   "do_train": torch.tensor(True), "do_valid": torch.tensor(False), "do_test": torch.tensor(False)}
    torch.save(train_state, iter_dir / "train_state.pt")
    shutil.copy(iter_dir / "train_state.pt", root / "latest_train_state.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    hf_config = json.loads((hf_dir / "config.json").read_text())
    with open(iter_dir / "run_config.yaml", "w") as handle:
        yaml.safe_dump(_run_config(hf_config, root, **change), handle, default_flow_style=False)
    return root


@pytest.fixture(scope="module")
def bridge_root(hf_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bridge")
    return _write_bridge_save(tmp / "save", hf_dir, tmp)


def _edited(bridge_root, tmp_path, edit):
    copy = tmp_path / "save"
    shutil.copytree(bridge_root, copy)
    edit(copy / ITER_DIR / "run_config.yaml")
    return copy


def test_the_fixture_has_bridges_layout(bridge_root):
    iter_dir = bridge_root / ITER_DIR
    common = torch.load(iter_dir / "common.pt", map_location="cpu", weights_only=False)
    assert "args" not in common and common["iteration"] == ITERATION  # Bridge: no args Namespace
    assert json.loads((iter_dir / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (iter_dir / "train_state.pt").is_file() and (bridge_root / "latest_train_state.pt").is_file()


def test_bridge_gemma_save_converts_to_hf_with_transformers_logits(bridge_root, hf_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the booby-trapped _target_ would create its file
    result = run_cli("convert", str(bridge_root), str(tmp_path / "hf"), "--to", "hf", "--hf-config", str(hf_dir))
    assert result.code == 0, result.err
    assert not (tmp_path / PWNED).exists()
    assert torch.equal(eager_logits(tmp_path / "hf", TOKENS), eager_logits(hf_dir, TOKENS))


def test_inspect_shows_the_run_config_as_args(bridge_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli("inspect", str(bridge_root / ITER_DIR))
    assert result.code == 0, result.err
    assert "run_config" in result.out
    assert not (tmp_path / PWNED).exists()


def test_the_model_section_reads_as_megatron_args(bridge_root):
    from ckptscope.mappings.bridge_config import megatron_args

    config = yaml.safe_load((bridge_root / ITER_DIR / "run_config.yaml").read_text())
    args = megatron_args(config)
    assert args["layernorm_zero_centered_gamma"] is True and args["untie_embeddings_and_output_weights"] is False
    assert args["group_query_attention"] is True and args["num_query_groups"] == 2 and args["kv_channels"] == 24
    assert args["swiglu"] is False and args["norm_epsilon"] == 1e-6  # fast_gelu: gated, not SiLU
    assert "rotary_base" not in args  # Gemma 3's (local, global) pair is not one base
    assert not any(isinstance(v, dict) for v in args.values())  # serialised code never becomes a value


@pytest.mark.parametrize("edit,message", [
    (lambda p: p.unlink(), "do not record"),
    (lambda p: p.write_text(p.read_text().replace("layernorm_zero_centered_gamma: true",
                                                  "layernorm_zero_centered_gamma: false")), "apply_layernorm_1p=False"),
], ids=["no-run-config", "not-zero-centred"])
def test_a_bridge_save_whose_config_does_not_say_zero_centred_is_refused(bridge_root, hf_dir, tmp_path, edit,
                                                                          message):
    edited = _edited(bridge_root, tmp_path, edit)
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(hf_dir))
    assert result.code == 2 and "zero-centred" in result.err and message in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_a_python_tag_in_the_run_config_is_refused_not_run(bridge_root, hf_dir, tmp_path, monkeypatch):
    """Bridge never writes YAML tags; one that asks for a Python call makes the file unreadable (safe_load),
    the config unknown, and the zero-centred Gemma export refused, with nothing run."""
    monkeypatch.chdir(tmp_path)

    def tag(path):
        path.write_text(path.read_text() + f"evil: !!python/object/apply:os.system ['touch {PWNED}']\n")

    edited = _edited(bridge_root, tmp_path, tag)
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(hf_dir))
    assert result.code == 2 and "zero-centred" in result.err, result.err
    assert not (tmp_path / PWNED).exists() and not (tmp_path / "out").exists()
    check = run_cli("inspect", str(edited / ITER_DIR))
    assert "run_config.yaml" in check.out + check.err and "not plain YAML" in check.out + check.err


def test_without_hf_config_the_gemma_only_settings_are_asked_for_not_defaulted(bridge_root, tmp_path):
    """A Bridge save has no ``hf_config_extra``: soft-capping, sliding window, query scale and local/global
    RoPE are not in the Megatron config, and transformers' defaults would be another model."""
    result = run_cli("convert", str(bridge_root), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "--hf-config" in result.err and "sliding_window" in result.err, result.err
    assert not (tmp_path / "out").exists()
