"""The Megatron writers (``ckptscope.formats.megatron.dist_writer``) checked against megatron-core itself.

A tiny GPTModel (local spec, SwiGLU, GQA 4 heads / 2 groups, untied and tied) gets random weights;
its TP=1 state, names in the OutTensor convention, goes through the writers:

* torch_dist: keys, shapes, dtypes and chunks equal megatron-core's own ``dist_checkpointing.save``
  of the same model; a fresh GPTModel loads it with ``dist_checkpointing.load`` bitwise; ckptscope's
  reader reads it back.
* legacy ``torch``: every rank file equals, key by key (order included) and bitwise, what
  megatron-core's own TP=2 / PP=2 GPTModel of that rank gives from ``state_dict_for_save_checkpoint()``
  after loading the same weights by megatron-core's own means (sample_ckpts/make_mcore_rank_refs.py,
  2 gloo ranks, loading the torch_dist dir written here: dist_checkpointing reshards it).

Every ``produce`` must run exactly once, and no produced array may still be alive when the next one
is produced (the writers stream).
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from streaming_producer import Producer as StreamingProducer

from ckptscope.core.errors import CkptError
from ckptscope.formats.megatron.dist_writer import OutTensor, legacy_rank_dir, write_torch_dist, write_torch_legacy
from ckptscope.formats.megatron.model_layout import pipeline_layer_ranges
from ckptscope.formats.registry import open_checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_ckpts"
VARIANTS = ("untied", "tied", "mqa")
"""The tiny GPT untied, tied, and untied with one query group (MQA: fewer groups than TP ranks at TP=2)."""
# The OutTensor convention: per-layer norms under the TE names (ckptscope/mappings/schemas.py rule.mcore[0]).
LOCAL_TO_TE = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
               "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def refs_module():
    """sample_ckpts/make_mcore_rank_refs.py, importable by name so spawned ranks find it too."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_mcore_rank_refs")


def out_name(name: str) -> str:
    parts = name.split(".")
    if name.startswith("decoder.layers.") and parts[2].isdigit():
        sub = ".".join(parts[3:])
        for local, te in LOCAL_TO_TE.items():
            if sub.startswith(local):
                sub = te + sub[len(local):]
        return ".".join(parts[:3] + [sub])
    return name


def Producer(state: dict) -> StreamingProducer:
    return StreamingProducer(state, out_name, collect=True)


def writer_args(args: argparse.Namespace, **override) -> dict:
    return {**vars(args), **override}


@pytest.fixture(scope="module")
def refs():
    return refs_module()


@pytest.fixture(scope="module")
def models(refs):
    """variant -> (Megatron args, TP=1 state_dict_for_save_checkpoint() with random weights)."""
    out = {}
    for seed, variant in enumerate(VARIANTS):
        args = refs.tiny_args(variant == "tied", **({"num_query_groups": 1} if variant == "mqa" else {}))
        out[variant] = (args, refs.random_model_state(args, seed=seed))
    return out


@pytest.fixture(scope="module")
def dist_dirs(models, refs, tmp_path_factory):
    """variant -> (ckptscope's torch_dist dir, megatron-core's own save of the same model, Producer)."""
    root = tmp_path_factory.mktemp("mcore_write")
    out = {}
    for variant, (args, state) in models.items():
        producer = Producer(state)
        mine = root / f"mine_{variant}" / "iter_0000003"
        seen: list[int] = []
        write_torch_dist(mine, producer.tensors, args=writer_args(args), iteration=refs.ITERATION,
                         progress=seen.append)
        assert sum(seen) == sum(4 * int(np.prod(t.shape)) for t in producer.tensors)
        real = refs.save_dist(state, args, root / f"real_{variant}" / "iter_0000003")
        out[variant] = (mine, real, producer)
    return out


def dcp_summary(path: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(path)).read_metadata()
    summary = {}
    for key, entry in md.state_dict_metadata.items():
        if hasattr(entry, "chunks"):
            summary[key] = (tuple(entry.size), entry.properties.dtype,
                            sorted((tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks))
        else:
            summary[key] = "bytes"
    return summary


# --- torch_dist -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_dist_is_what_megatron_core_saves(dist_dirs, variant):
    from torch.distributed.checkpoint import FileSystemReader

    mine, real, producer = dist_dirs[variant]
    producer.check_streamed()
    assert dcp_summary(mine) == dcp_summary(real)
    assert sorted(p.name for p in mine.iterdir()) == sorted(p.name for p in real.iterdir())
    assert (mine / "metadata.json").read_bytes() == (real / "metadata.json").read_bytes()
    mine_common = torch.load(mine / "common.pt", weights_only=False)
    assert mine_common == torch.load(real / "common.pt", weights_only=False)
    assert list(mine_common) == ["args", "checkpoint_version", "iteration"]
    md_mine, md_real = (FileSystemReader(str(p)).read_metadata() for p in (mine, real))
    assert md_mine.planner_data is None and md_real.planner_data is None
    assert md_mine.version == md_real.version
    plan_keys = [sorted((i.index.fqn, tuple(i.index.offset or ())) for i in md.all_local_plans[0].items)
                 for md in (md_mine, md_real)]
    assert plan_keys[0] == plan_keys[1]
    # the ShardedObjects hold what megatron-core put there: a torch.save of [None] (local spec)
    for index, info in md_mine.storage_data.items():
        if "/shard_" in index.fqn:
            raw = (mine / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
            assert torch.load(io.BytesIO(raw), weights_only=False) == [None]


@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_dist_loads_bitwise_into_a_fresh_gptmodel(dist_dirs, models, refs, variant):
    from megatron.core import dist_checkpointing

    gen = importlib.import_module("make_mcore_pair_samples")
    args, state = models[variant]
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        model = refs.build_rank_model(args)
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(dist_dirs[variant][0]))
        model.load_state_dict(loaded["model"], strict=True)
    params = dict(model.named_parameters())
    assert params
    for name, param in params.items():
        assert torch.equal(param, state[name]), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_dist_reads_back_with_ckptscope(dist_dirs, models, refs, variant):
    _, state = models[variant]
    mine, _, producer = dist_dirs[variant]
    with open_checkpoint(mine) as reader:
        assert reader.format_name == "megatron_dist"
        index = reader.index()
        assert index.metadata["iteration"] == refs.ITERATION
        by_out = {out_name(k): v for k, v in state.items() if v is not None}
        for tensor in producer.tensors:
            np.testing.assert_array_equal(reader.read(tensor.name), by_out[tensor.name].numpy(), strict=True)
        objects = {o.name.split("/")[0] for o in index.objects}
        assert "decoder.layers.mlp.linear_fc1._extra_state" in objects


def test_torch_dist_bf16_from_numpy_torch_and_cast(models, tmp_path):
    """bf16 arrives as ml_dtypes arrays, torch tensors, or float32 arrays to cast: all store torch's bf16."""
    import ml_dtypes
    from torch.distributed.checkpoint import FileSystemReader, load

    args, state = models["untied"]
    full = {out_name(k): v for k, v in state.items() if v is not None}
    bf16 = {name: value.to(torch.bfloat16) for name, value in full.items()}
    ways = {
        "numpy": [OutTensor(n, tuple(t.shape), "bfloat16",
                            lambda t=t: t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)) for n, t in bf16.items()],
        "torch": [OutTensor(n, tuple(t.shape), "bfloat16", lambda t=t: t) for n, t in bf16.items()],
        "cast": [OutTensor(n, tuple(t.shape), "bfloat16", lambda t=t: t.numpy()) for n, t in full.items()],
    }
    for how, tensors in ways.items():
        target = tmp_path / how
        write_torch_dist(target, tensors, args=writer_args(args, bf16=True), iteration=1)
        md = FileSystemReader(str(target)).read_metadata()
        stored = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
                  for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks")}
        load(stored, checkpoint_id=str(target), no_dist=True)  # torch's own reader, no process group
        for name, value in bf16.items():
            parts = name.split(".")
            layer = name.startswith("decoder.layers.") and parts[2].isdigit()
            got = stored[".".join(parts[:2] + parts[3:])][int(parts[2])] if layer else stored[name]
            assert got.dtype == torch.bfloat16 and torch.equal(got, value), (how, name)


# --- legacy torch ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def legacy(dist_dirs, models, refs, tmp_path_factory):
    """case -> (ckptscope's legacy iteration dir, megatron-core's per-rank references dir, Producer)."""
    root = tmp_path_factory.mktemp("mcore_legacy")
    references = refs.rank_references({v: dist_dirs[v][0] for v in VARIANTS}, root / "references")
    out = {}
    for case in refs.CASES:
        args, state = models[case.get("variant") or ("tied" if case["tied"] else "untied")]
        producer = Producer(state)
        iter_dir = root / case["name"] / "iter_0000003"
        full_args = writer_args(args, tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
                                **case.get("args", {}))
        write_torch_legacy(iter_dir, producer.tensors, args=full_args, iteration=refs.ITERATION, tp=case["tp"],
                           pp=case["pp"])
        out[case["name"]] = (iter_dir, references / case["name"], producer, case, full_args)
    return out


@pytest.mark.parametrize("case", ["tp2_untied", "tp2_tied", "pp2_untied", "pp2_tied", "pp2_uneven", "tp2_mqa"])
def test_legacy_rank_files_equal_megatron_core_per_rank(legacy, refs, case):
    iter_dir, references, producer, spec, args = legacy[case]
    producer.check_streamed()
    ranks = [legacy_rank_dir(t, p, spec["pp"]) for p in range(spec["pp"]) for t in range(spec["tp"])]
    assert sorted(p.name for p in iter_dir.iterdir()) == sorted(ranks)
    assert sorted(p.name for p in references.iterdir()) == sorted(ranks)
    for rank in ranks:
        path = iter_dir / rank / "model_optim_rng.pt"
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None  # the patched CRC-32s are right
        mine = torch.load(path, weights_only=False)
        expected = torch.load(references / rank / "reference.pt", weights_only=False)["model"]
        assert list(mine) == ["args", "checkpoint_version", "iteration", "model"]
        assert mine["args"] == argparse.Namespace(**args)
        assert (mine["checkpoint_version"], mine["iteration"]) == (3.0, refs.ITERATION)
        assert list(mine["model"]) == list(expected), rank
        for name, value in expected.items():
            got = mine["model"][name]
            if value is None:
                assert got is None, (rank, name)
            else:
                assert type(got) is torch.Tensor and got.dtype == value.dtype, (rank, name)
                assert torch.equal(got, value), (rank, name)


def test_legacy_bf16_equals_the_verified_fp32_files_cast(legacy, models, refs, tmp_path):
    """bf16 OutTensors (float32 arrays the writer casts) give the fp32 rank files, checked above against
    megatron-core, cast to bf16: same keys, same slices."""
    iter_dir, _, _, _, args = legacy["tp2_untied"]
    _, state = models["untied"]
    tensors = [OutTensor(t.name, t.shape, "bfloat16", t.produce) for t in Producer(state).tensors]
    write_torch_legacy(tmp_path, tensors, args=args, iteration=refs.ITERATION, tp=2, pp=1)
    for rank in ("mp_rank_00", "mp_rank_01"):
        fp32 = torch.load(iter_dir / rank / "model_optim_rng.pt", weights_only=False)["model"]
        bf16 = torch.load(tmp_path / rank / "model_optim_rng.pt", weights_only=False)["model"]
        assert list(bf16) == list(fp32)
        for name, value in fp32.items():
            if value is None:
                assert bf16[name] is None
            else:
                assert bf16[name].dtype == torch.bfloat16 and torch.equal(bf16[name], value.to(torch.bfloat16)), name


def test_legacy_tied_pipeline_copies_the_embedding_to_the_last_stage(legacy):
    iter_dir, _, _, _, _ = legacy["pp2_tied"]
    first = torch.load(iter_dir / "mp_rank_00_000" / "model_optim_rng.pt", weights_only=False)["model"]
    last = torch.load(iter_dir / "mp_rank_00_001" / "model_optim_rng.pt", weights_only=False)["model"]
    assert "output_layer.weight" not in first and "embedding.word_embeddings.weight" not in last
    assert torch.equal(last["output_layer.weight"], first["embedding.word_embeddings.weight"])


def test_legacy_is_read_by_ckptscope(legacy):
    iter_dir = legacy["tp2_untied"][0]
    with open_checkpoint(iter_dir) as reader:
        names = set(reader.index().tensors) | set(reader.index().views)
    assert names, reader.format_name
    assert any("linear_fc1.weight" in n for n in names)


def test_legacy_te_spec_uses_te_names_and_empty_extra_states(models, tmp_path):
    """TE spec (MAPPING.md §1.2/§1.3; no TE installed here to compare with): fused norm names, no
    input_layernorm/pre_mlp_layernorm, ``core_attention._extra_state``, empty uint8 extra states."""
    args, state = models["untied"]
    write_torch_legacy(tmp_path, Producer(state).tensors, args=writer_args(args), iteration=1, tp=1, pp=1, spec="te")
    model = torch.load(tmp_path / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)["model"]
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in model
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in model
    assert not any("input_layernorm" in k or "pre_mlp_layernorm" in k for k in model)
    extra = model["decoder.layers.0.self_attention.core_attention._extra_state"]
    assert extra.dtype == torch.uint8 and extra.numel() == 0
    assert model["output_layer._extra_state"] is None  # mcore's own ColumnParallelLinear in both specs


# --- pipeline stages and refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("num_layers,pp,extra", [
    (8, 2, {}), (8, 4, {}), (7, 2, {"num_layers_in_first_pipeline_stage": 3}),
    (9, 3, {"num_layers_in_first_pipeline_stage": 1, "num_layers_in_last_pipeline_stage": 2}),
    (10, 4, {"num_layers_in_first_pipeline_stage": 1, "num_layers_in_last_pipeline_stage": 1}),
    (7, 2, {"account_for_embedding_in_pipeline_split": True}),
    (6, 2, {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}),
])
def test_pipeline_layer_ranges_match_megatron_core(num_layers, pp, extra):
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = TransformerConfig(num_layers=num_layers, hidden_size=8, num_attention_heads=2, activation_func=F.silu,
                               pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32, **extra)
    expected = [range(get_transformer_layer_offset(config, pp_rank=p),
                      get_transformer_layer_offset(config, pp_rank=p) + get_num_layers_to_build(config, pp_rank=p))
                for p in range(pp)]
    assert pipeline_layer_ranges(num_layers, pp, extra) == expected


def _one(name: str, shape: tuple[int, ...]) -> OutTensor:
    return OutTensor(name, shape, "float32", lambda: np.zeros(shape, np.float32))


def _tiny(layers: int = 1, tied: bool = True) -> list[OutTensor]:
    tensors = [_one("embedding.word_embeddings.weight", (8, 4)), _one("decoder.final_layernorm.weight", (4,))]
    for i in range(layers):
        tensors += [_one(f"decoder.layers.{i}.self_attention.linear_qkv.weight", (6, 4)),
                    _one(f"decoder.layers.{i}.mlp.linear_fc1.weight", (6, 4))]
    if not tied:
        tensors.append(_one("output_layer.weight", (8, 4)))
    return tensors


@pytest.mark.parametrize("tensors,args,message", [
    ([*_tiny(), _one("decoder.layers.0.mlp.experts.linear_fc1.weight0", (4, 4))], {}, "not a dense GPTModel tensor"),
    (_tiny(tied=False), {"untie_embeddings_and_output_weights": False}, "output_layer.weight was given"),
    (_tiny(), {"untie_embeddings_and_output_weights": True}, "output_layer.weight is missing"),
    (_tiny(2)[:-1], {}, "does not hold the same tensors"),
    (_tiny(2), {"num_layers": 3}, "num_layers=3"),
    ([*_tiny(), _one("decoder.layers.2.mlp.linear_fc2.weight", (4, 3))], {}, "without gaps"),
    (_tiny(), {"swiglu": True, "tensor_model_parallel_size": 2}, "does not split over TP=2"),
])
def test_bad_tensor_lists_are_refused_before_writing(tensors, args, message, tmp_path):
    writer = write_torch_legacy if "tensor_model_parallel_size" in args else write_torch_dist
    kwargs = {"tp": args["tensor_model_parallel_size"], "pp": 1} if writer is write_torch_legacy else {}
    with pytest.raises(CkptError, match=message):
        writer(tmp_path / "out", tensors, args=args, iteration=1, **kwargs)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.p*"))


def test_other_refusals(tmp_path):
    with pytest.raises(CkptError, match="unknown Megatron layer spec"):
        write_torch_dist(tmp_path, _tiny(), args={}, iteration=1, spec="tex")
    with pytest.raises(CkptError, match="tensor_model_parallel_size=4"):
        write_torch_legacy(tmp_path, _tiny(), args={"tensor_model_parallel_size": 4}, iteration=1, tp=2, pp=1)
    wrong = _tiny()
    wrong[0] = OutTensor(wrong[0].name, (8, 4), "float32", lambda: np.zeros((4, 8), np.float32))
    with pytest.raises(CkptError, match="produced shape"):
        write_torch_dist(tmp_path / "shape", wrong, args={}, iteration=1)
    with pytest.raises(CkptError, match="larger than 0"):
        pipeline_layer_ranges(6, 3, {"num_layers_in_last_pipeline_stage": 0})
    with pytest.raises(CkptError, match="virtual pipeline"):
        pipeline_layer_ranges(4, 2, {"virtual_pipeline_model_parallel_size": 2})
