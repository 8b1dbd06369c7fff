"""PEFT LoRA adapters through the real CLI: inspect, ``lora stats``, ``lora merge``.

Fixtures come from sample_ckpts/make_peft_samples.py (transformers ``save_pretrained`` for the base,
``PeftModel.save_pretrained`` for the adapters); the merge is checked bit for bit against PEFT's own
``merge_and_unload()``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, load_sample_module, run_cli

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def peft_samples(tmp_path_factory) -> dict[str, Path]:
    module = load_sample_module("make_peft_samples")
    out = tmp_path_factory.mktemp("peft")
    return {name: writer(out) for name, writer in module.WRITERS.items()}


def _inspect(path: Path) -> dict:
    result = run_cli("inspect", "--json", str(path))
    assert result.code == 0, result.err
    return json.loads(result.out)


def _adapter_arrays(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_inspect_shows_pairs_with_rank_and_alpha(peft_samples):
    doc = _inspect(peft_samples["peft_lora"])
    assert doc["format"] == "peft"
    names = {t["name"] for t in doc["tensors"]}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    lora = doc["metadata"]["lora"]
    assert lora["num_pairs"] == 6 and lora["r"] == 4 and lora["lora_alpha"] == 8
    for pair in lora["pairs"]:
        assert pair["r"] == 4 and pair["lora_alpha"] == 8 and pair["scaling"] == 2.0
        assert pair["A"].endswith(".lora_A.weight") and pair["B"].endswith(".lora_B.weight")
    assert set(lora["modules"]) == {"q_proj", "v_proj", "down_proj"}
    assert lora["modules"]["q_proj"]["line"] == "q_proj: 2 layers, r=4, alpha=8, scale=2"
    assert lora["unsupported_merge"] == []
    assert {"name": "adapter_config", "type": "json"} in doc["objects"]

    human = run_cli("inspect", str(peft_samples["peft_lora"]))
    assert human.code == 0, human.err
    assert "q_proj: 2 layers, r=4, alpha=8" in human.out


def test_inspect_rslora_and_rank_pattern(peft_samples):
    lora = _inspect(peft_samples["peft_lora_rslora"])["metadata"]["lora"]
    assert lora["use_rslora"] is True
    by_module = {p["module"]: p for p in lora["pairs"]}
    special = by_module["model.layers.1.self_attn.v_proj"]
    assert (special["r"], special["lora_alpha"]) == (2, 6)
    assert special["scaling"] == pytest.approx(6 / 2 ** 0.5)
    assert by_module["model.layers.0.self_attn.v_proj"]["scaling"] == pytest.approx(8 / 4 ** 0.5)
    assert lora["modules"]["v_proj"]["r"] == [2, 4]


def test_inspect_fan_in_fan_out_and_biases(peft_samples):
    lora = _inspect(peft_samples["peft_gpt2_lora"])["metadata"]["lora"]
    assert lora["fan_in_fan_out"] is True and lora["bias"] == "lora_only" and lora["lora_bias"] is True
    assert len(lora["saved_biases"]) == 4 and all(".base_layer.bias" in n for n in lora["saved_biases"])
    assert all(p["lora_bias"].endswith(".lora_B.bias") for p in lora["pairs"])
    assert lora["unsupported_merge"] == [] and lora["other_tensors"] == []


def test_stats_rank_matches_numpy(peft_samples, tmp_path):
    # A rank-deficient copy: one B column repeats another, so B @ A has rank r - 1.
    adapter = tmp_path / "lowrank"
    shutil.copytree(peft_samples["peft_lora"], adapter)
    arrays = _adapter_arrays(adapter)
    low = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    arrays[low][:, 1] = arrays[low][:, 0]
    from safetensors.numpy import save_file

    save_file(arrays, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})
    for path in (peft_samples["peft_lora"], peft_samples["peft_lora_rslora"], adapter):
        result = run_cli("lora", "stats", "--json", str(path))
        assert result.code == 0, result.err
        doc = json.loads(result.out)
        arrays = _adapter_arrays(path)
        assert len(doc["pairs"]) == 6
        for pair in doc["pairs"]:
            prefix = "base_model.model." + pair["module"]
            product = arrays[prefix + ".lora_B.weight"].astype(np.float64) @ arrays[prefix + ".lora_A.weight"].astype(np.float64)
            assert pair["rank"] == np.linalg.matrix_rank(product), pair["module"]
            expected = np.linalg.svd(product, compute_uv=False)[: pair["r"]]
            np.testing.assert_allclose(pair["singular_values"], expected, rtol=1e-12)
        if path == adapter:
            ranks = {p["module"]: p["rank"] for p in doc["pairs"]}
            assert ranks["model.layers.0.self_attn.q_proj"] == 3
    human = run_cli("lora", "stats", str(adapter))
    assert human.code == 0 and "rank 3/4" in human.out


def _peft_merged_state(base: Path, adapter: Path) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return {k: v.detach().contiguous() for k, v in merged.state_dict().items()}


@pytest.mark.parametrize(("adapter", "base_name", "n_changed"), [
    ("peft_lora", "peft_llama_base", 6),  # q_proj, v_proj, down_proj in 2 layers: B was set non-zero
    ("peft_lora_rslora", "peft_llama_base", 6),
    ("peft_gpt2_lora", "peft_gpt2_base", 8),  # fan_in_fan_out Conv1D weights and their biases (lora_only + lora_bias)
    # a square Conv1D (transposed) beside a Linear (not) while the saved config says fan_in_fan_out=false:
    # before, c_proj was merged untransposed (exit 0, logits off by 1.75)
    ("peft_gpt2_mixed_lora", "peft_gpt2_untied_base", 3),
    # modules_to_save: the trained copy of lm_head replaces the base's (6 q/v/down weights + lm_head). Refused before.
    ("peft_lora_modules_to_save", "peft_llama_base", 7),
    # save_embedding_layers: lm_head's saved base weight replaces the base's and its pair is merged into it
    # (4 q/v weights + lm_head); untargeted, the saved embedding and head replace the base's (6 q/v/down + 2). Refused before.
    ("peft_lora_saved_embeddings", "peft_llama_base", 5),
    ("peft_lora_saved_untargeted_embeddings", "peft_llama_base", 8),
])
def test_merge_equals_peft_merge_and_unload_bitwise(peft_samples, tmp_path, adapter, base_name, n_changed):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    base_dir = peft_samples[base_name]
    result = run_cli("lora", "merge", str(peft_samples[adapter]), str(base_dir), str(out))
    assert result.code == 0, result.err
    ours = load_file(str(out / "model.safetensors"))
    reference = _peft_merged_state(base_dir, peft_samples[adapter])
    if "lm_head.weight" not in ours:  # GPT-2 ties it to wte: not stored, as in the base
        del reference["lm_head.weight"]
    assert set(ours) == set(reference)
    base = load_file(str(base_dir / "model.safetensors"))
    changed = 0
    for name, tensor in reference.items():
        assert ours[name].dtype == tensor.dtype == torch.float32, name
        assert torch.equal(ours[name].view(torch.int32), tensor.view(torch.int32)), name
        changed += not torch.equal(base[name], ours[name])
    assert changed == n_changed

    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info


def test_merge_float32_keeps_fp32(peft_samples, tmp_path):
    out = tmp_path / "merged32"
    result = run_cli("lora", "merge", "--dtype", "float32", "--json", str(peft_samples["peft_lora"]),
                     str(peft_samples["peft_llama_base"]), str(out))
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    assert len(plan["merged"]) == 6 and plan["dtype"] == "float32"
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "generation_config.json").is_file()


def _refused(result, out: Path, parent_before: set[str]) -> None:
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptscope: error:"), result.err
    assert "Traceback" not in result.err
    assert not out.exists()
    assert set(p.name for p in out.parent.iterdir()) == parent_before  # no temp dir left behind


def test_merge_refusals_write_nothing(peft_samples, tmp_path):
    base = str(peft_samples["peft_llama_base"])
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"

    result = run_cli("lora", "merge", str(peft_samples["peft_lora_dora"]), base, str(out))
    _refused(result, out, set())
    assert "DoRA" in result.err

    to_save = tmp_path / "to_save"
    shutil.copytree(peft_samples["peft_lora"], to_save)
    config = json.loads((to_save / "adapter_config.json").read_text())
    config["modules_to_save"] = ["lm_head"]
    (to_save / "adapter_config.json").write_text(json.dumps(config))
    result = run_cli("lora", "merge", str(to_save), base, str(out))
    _refused(result, out, set())
    assert "modules_to_save" in result.err

    embed = tmp_path / "embed"
    shutil.copytree(peft_samples["peft_lora"], embed)
    from safetensors.numpy import save_file

    arrays = _adapter_arrays(embed)
    arrays["base_model.model.model.embed_tokens.lora_embedding_A"] = np.zeros((4, 128), np.float32)
    arrays["base_model.model.model.embed_tokens.lora_embedding_B"] = np.zeros((32, 4), np.float32)
    save_file(arrays, str(embed / "adapter_model.safetensors"), metadata={"format": "pt"})
    result = run_cli("lora", "merge", str(embed), base, str(out))
    _refused(result, out, set())
    assert "embedding LoRA" in result.err

    result = run_cli("lora", "merge", base, base, str(out))  # the base is no adapter
    _refused(result, out, set())

    result = run_cli("lora", "merge", str(peft_samples["peft_lora"]), str(peft_samples["peft_lora_rslora"]), str(out))
    _refused(result, out, set())  # an adapter is no base model

    out.mkdir()
    result = run_cli("lora", "merge", str(peft_samples["peft_lora"]), base, str(out))
    assert result.code == 2 and "destination exists" in result.err and not any(out.iterdir())


def test_adapter_model_bin_is_read(peft_samples, tmp_path):
    import torch
    from safetensors.torch import load_file

    adapter = tmp_path / "bin_adapter"
    adapter.mkdir()
    shutil.copy(peft_samples["peft_lora"] / "adapter_config.json", adapter)
    torch.save(load_file(str(peft_samples["peft_lora"] / "adapter_model.safetensors")), adapter / "adapter_model.bin")
    doc = _inspect(adapter)
    assert doc["format"] == "peft" and doc["metadata"]["weights"] == "adapter_model.bin"
    assert doc["metadata"]["lora"]["num_pairs"] == 6
    a = json.loads(run_cli("lora", "stats", "--json", str(adapter)).out)
    b = json.loads(run_cli("lora", "stats", "--json", str(peft_samples["peft_lora"])).out)
    assert [p["singular_values"] for p in a["pairs"]] == [p["singular_values"] for p in b["pairs"]]


def test_indexing_and_stats_never_import_torch(peft_samples):
    code = (
        "import sys\n"
        "from ckptscope.cli import main\n"
        "for args in (['inspect', '--json', sys.argv[1]], ['lora', 'stats', '--json', sys.argv[1]]):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, e.code\n"
        "bad = [m for m in ('torch', 'textual', 'peft', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code, str(peft_samples["peft_lora"])], check=True, cwd=REPO,
                   capture_output=True)


def test_large_pairs_use_the_qr_core_with_the_same_values(peft_samples):
    from ckptscope.ops.lora import lora_stats

    _, full = lora_stats(peft_samples["peft_lora"])
    _, core = lora_stats(peft_samples["peft_lora"], full_svd_max_elems=0)
    assert {p.method for p in full} == {"svd"} and {p.method for p in core} == {"qr"}
    for a, b in zip(full, core):
        assert a.rank == b.rank
        np.testing.assert_allclose(a.singular_values, b.singular_values, rtol=1e-12)


def test_without_torch_stats_work_and_merge_refuses(peft_samples, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NotInstalled())\n")
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    assert run_cli("inspect", "--json", str(peft_samples["peft_lora"]), env=env).code == 0
    assert run_cli("lora", "stats", str(peft_samples["peft_lora"]), env=env).code == 0
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    result = run_cli("lora", "merge", str(peft_samples["peft_lora"]), str(peft_samples["peft_llama_base"]), str(out),
                     env=env)
    _refused(result, out, set())
    assert "torch" in result.err


@pytest.mark.parametrize("adapter", ["peft_lora", "peft_lora_modules_to_save", "peft_lora_saved_embeddings"])
def test_merge_into_a_bfloat16_base_equals_peft(peft_samples, tmp_path, adapter):
    """PEFT upcasts the adapter to float32 and adds its update to the bf16 weight in float32; a whole weight
    saved with the adapter (float32) is rounded into the bf16 parameter it replaces before that."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base_bf16"
    AutoModelForCausalLM.from_pretrained(peft_samples["peft_llama_base"], dtype=torch.bfloat16).save_pretrained(base)
    out = tmp_path / "merged_bf16"
    result = run_cli("lora", "merge", str(peft_samples[adapter]), str(base), str(out))
    assert result.code == 0, result.err
    ours = load_file(str(out / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    reference = PeftModel.from_pretrained(model, peft_samples[adapter]).merge_and_unload().state_dict()
    for name, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor.view(torch.int16), reference[name].contiguous().view(torch.int16)), name


@pytest.fixture(scope="module")
def peft_trainer_run(peft_samples, tmp_path_factory) -> Path:
    """A transformers Trainer run of a LoRA model (2 CPU steps, save_steps=2): output_dir/checkpoint-2
    holds adapter_model.safetensors and adapter_config.json beside the Trainer's optimizer.pt,
    scheduler.pt, rng_state.pth, training_args.bin and trainer_state.json, as Trainer writes them."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    out = tmp_path_factory.mktemp("peft_trainer")
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(peft_samples[load_sample_module("make_peft_samples").BASE]),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir=str(out), max_steps=2, save_steps=2, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens()).train()
    return out / "checkpoint-2"


def test_a_trainer_checkpoint_of_an_adapter_is_a_trainer_checkpoint(peft_trainer_run, tmp_path):
    assert (peft_trainer_run / "adapter_model.safetensors").is_file()
    doc = _inspect(peft_trainer_run)
    assert doc["layout"] == "HF Trainer checkpoint of a PEFT adapter (step 2)"
    roles = {f["path"]: f["role"] for f in doc["metadata"]["files"]}
    assert roles["optimizer.pt"] == "optimizer" and roles["trainer_state.json"] == "state"
    assert run_cli("check", str(peft_trainer_run)).code == 0
    unfinished = tmp_path / "checkpoint-2"
    shutil.copytree(peft_trainer_run, unfinished)
    (unfinished / "trainer_state.json").unlink()
    result = run_cli("check", str(unfinished))
    assert result.code == 1 and "missing-marker: trainer_state.json" in result.out, result.out


def test_convert_names_why_an_adapter_or_an_unmapped_architecture_does_not_convert(peft_samples, tmp_path):
    module = load_sample_module("make_peft_samples")
    adapter = run_cli("convert", str(peft_samples["peft_lora"]), str(tmp_path / "a"), "--to", "hf")
    assert adapter.code == 2 and "ckptscope lora merge" in adapter.err, adapter.err
    gpt2 = run_cli("convert", str(peft_samples[module.GPT2_BASE]), str(tmp_path / "g"), "--to", "mcore")
    assert gpt2.code == 2 and "GPT2LMHeadModel" in gpt2.err and "ckptscope archs" in gpt2.err, gpt2.err
    assert not (tmp_path / "a").exists() and not (tmp_path / "g").exists()


def test_alora_is_refused_as_peft_refuses_it(peft_samples, tmp_path):
    """aLoRA's tensors are plain LoRA pairs; only its config says the update applies after the invocation
    tokens. Merged as LoRA it was another model (exit 0); PEFT's own merge raises."""
    assert json.loads((peft_samples["peft_alora"] / "adapter_config.json").read_text())["alora_invocation_tokens"]
    result = run_cli("lora", "merge", str(peft_samples["peft_alora"]), str(peft_samples["peft_llama_base"]),
                     str(tmp_path / "out"))
    assert result.code == 2 and "aLoRA" in result.err and not (tmp_path / "out").exists(), result.err


@pytest.mark.parametrize("change, said", [({"r": -4}, "no usable r/lora_alpha"), ({"lora_alpha": float("nan")}, "lora_alpha=nan"),
                                          ({"r": 8}, "r=8 in adapter_config.json but lora_A has rank 4"),
                                          ({"lora_alpha": "8"}, "no usable r/lora_alpha")])
def test_adapter_config_values_that_would_change_the_merge_are_refused(peft_samples, tmp_path, change, said):
    """A negative r flipped the update's sign, a NaN alpha made every merged weight NaN, an r other than
    the stored rank merged with another scale (PEFT refuses to load such an adapter): all exit 0 before."""
    adapter = tmp_path / "adapter"
    shutil.copytree(peft_samples["peft_lora"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config.update(change)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    result = run_cli("lora", "merge", str(adapter), str(peft_samples["peft_llama_base"]), str(tmp_path / "out"))
    assert result.code == 2 and said in result.err and not (tmp_path / "out").exists(), result.err


def test_lora_commands_on_a_trainer_root_of_peft_checkpoints(tmp_path):
    """The transformers Trainer over a PEFT model writes ``checkpoint-N/adapter_*`` under its output dir:
    inspect and diff took the root for its newest checkpoint, ``lora stats`` / ``lora merge`` said "not a
    checkpoint". They now do the same; the merge equals PEFT's merge_and_unload of the trained model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.numpy import load_file
    from transformers import Trainer, TrainingArguments

    gen = load_sample_module("make_trainer_samples")
    base = tmp_path / "base"
    gen.tiny_model(seed=0).save_pretrained(str(base))
    model = get_peft_model(gen.tiny_model(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    batch = torch.randint(0, 100, (8, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in batch]
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=4, save_steps=2, per_device_train_batch_size=4,
                             report_to="none", use_cpu=True, learning_rate=1e-2)
    Trainer(model=model, args=args, train_dataset=data).train()
    assert (tmp_path / "run" / "checkpoint-4" / "adapter_config.json").is_file()
    stats = run_cli("lora", "stats", "--json", str(tmp_path / "run"))
    assert stats.code == 0 and "checkpoint-4" in stats.err, stats.err
    assert len(json.loads(stats.out)["pairs"]) == 4
    merged = tmp_path / "merged"
    result = run_cli("lora", "merge", str(tmp_path / "run"), str(base), str(merged))
    assert result.code == 0, result.err
    want = {k: v.detach().numpy() for k, v in model.merge_and_unload().state_dict().items()}
    got = load_file(str(merged / "model.safetensors"))
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("change, said", [({"alpha_pattern": {"q_proj": [1]}}, "no usable r/lora_alpha"),
                                          ({"lora_alpha": 1e300}, "is not finite")])
def test_a_lora_config_that_cannot_give_a_finite_merge_is_refused(peft_samples, tmp_path, change, said):
    """A list as an alpha_pattern value gave "internal error: TypeError"; lora_alpha 1e300 wrote a model
    of inf weights with exit 0 (a probe). Both are refused in one line, nothing written."""
    adapter = tmp_path / "adapter"
    shutil.copytree(peft_samples["peft_lora"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    result = run_cli("lora", "merge", str(adapter), str(peft_samples["peft_llama_base"]), str(out))
    _refused(result, out, {"adapter"})
    assert said in result.err and "internal" not in result.err, result.err


def test_a_peft_wrapped_training_state_dict_is_refused_for_what_it_is(tmp_path):
    """verl's LoRA runs save the PEFT-wrapped model's state dict per rank (``base_model.model.<name>``,
    ``.base_layer.weight``, ``lora_A.default.weight``): convert said the architecture had no mapping (it
    has one), which sent users to the wrong fix. Here the same names, from PEFT's own ``get_peft_model``."""
    import torch
    from peft import IA3Config, LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64))
    wrapped = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.save(wrapped.state_dict(), tmp_path / "model.pt")
    result = run_cli("convert", str(tmp_path / "model.pt"), "--to", "hf", str(tmp_path / "out"))
    assert result.code == 2 and "a model wrapped by PEFT for LoRA training" in result.err, result.err
    assert "lora_A" in result.err and "no HF <-> Megatron-Core mapping" not in result.err
    assert not (tmp_path / "out").exists()
    # the PEFT wrapper without LoRA (IA3): said as a wrapped model, not sent to `lora merge`
    ia3 = get_peft_model(LlamaForCausalLM(base.config), IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                                                                   feedforward_modules=["down_proj"]))
    torch.save(ia3.state_dict(), tmp_path / "ia3.pt")
    result = run_cli("convert", str(tmp_path / "ia3.pt"), "--to", "hf", str(tmp_path / "out"))
    assert result.code == 2 and "a model wrapped by PEFT (" in result.err and "lora merge" not in result.err



def test_an_adapter_peft_cannot_load_is_a_check_problem(peft_samples, tmp_path):
    """A pair missing its lora_B, or adapter_config.json's r against the stored rank: inspect warned and lora
    merge refused, but check said ok and lora stats listed the other pairs without a word (a probe with the
    transformers Trainer's PEFT checkpoints)."""
    from safetensors.numpy import load_file, save_file

    adapter = tmp_path / "adapter"
    shutil.copytree(peft_samples["peft_lora"], adapter)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    gone = sorted(n for n in weights if ".lora_B." in n)[0]
    save_file({n: v for n, v in weights.items() if n != gone}, str(adapter / "adapter_model.safetensors"))
    module = gone.split(".lora_B.")[0].removeprefix("base_model.model.")
    result = run_cli("check", str(adapter))
    assert result.code == 1, result.out
    assert f"inconsistent-adapter: adapter_model.safetensors: {module}: lora_B is missing" in result.out
    stats = run_cli("lora", "stats", str(adapter))
    assert stats.code == 0 and f"warning: {module}: lora_B is missing, the pair is incomplete" in stats.err

    save_file(weights, str(adapter / "adapter_model.safetensors"))
    assert run_cli("check", str(adapter)).code == 0
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "r": config["r"] * 2}))
    result = run_cli("check", str(adapter))
    assert result.code == 1 and f"says r={config['r'] * 2}, lora_A is stored with rank {config['r']}" in result.out


def test_an_adapter_saved_for_a_resized_vocabulary_is_refused(peft_samples, tmp_path):
    """Training with added tokens resizes the embedding; save_embedding_layers then saves it at its new size.
    PEFT itself needs the base resized first; merging it into the original base would mix sizes."""
    import torch
    from peft import LoraConfig, get_peft_model

    module = load_sample_module("make_peft_samples")
    model = module.tiny_base()
    model.resize_token_embeddings(model.config.vocab_size + 4)
    torch.manual_seed(0)
    adapter = tmp_path / "resized"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(
        adapter, save_embedding_layers=True)
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    result = run_cli("lora", "merge", str(adapter), str(peft_samples["peft_llama_base"]), str(out))
    _refused(result, out, set())
    assert "vocabulary was resized" in result.err


@pytest.mark.parametrize("key, value, said", [
    ("r", "4", "r is '4', not a positive integer"),
    ("lora_alpha", None, "lora_alpha is None, not a number"),
    ("alpha_pattern", [4], "alpha_pattern is [4], not a mapping"),
    ("rank_pattern", {"q_proj": "x"}, "rank_pattern['q_proj'] is 'x'"),
    ("r", float("inf"), "r is inf, not a positive integer"),
])
def test_adapter_config_values_no_scale_comes_from_are_one_line(peft_samples, tmp_path, key, value, said):
    """A probe damaged adapter_config.json: lora stats and inspect said "internal error: TypeError/ValueError".
    Now stats and merge refuse in one line, check lists it, inspect warns."""
    adapter = tmp_path / "adapter"
    shutil.copytree(peft_samples["peft_lora_rslora"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config[key] = value
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    for args in (("lora", "stats", str(adapter)), ("lora", "merge", str(adapter), str(peft_samples["peft_llama_base"]),
                                                   str(tmp_path / "out"))):
        result = run_cli(*args)
        assert result.code == 2 and said in result.err and "internal error" not in result.err, result.err
    assert not (tmp_path / "out").exists()
    result = run_cli("check", str(adapter))
    assert result.code == 1 and said in result.out, result.out
    assert run_cli("inspect", str(adapter)).code == 0


def test_a_modules_to_save_that_is_no_list_is_one_line(peft_samples, tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(peft_samples["peft_lora"], adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["modules_to_save"] = 1.5
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    result = run_cli("lora", "merge", str(adapter), str(peft_samples["peft_llama_base"]), str(tmp_path / "out"))
    assert result.code == 2 and "modules_to_save is 1.5, not a list" in result.err, result.err
    assert run_cli("check", str(adapter)).code == 1 and run_cli("inspect", str(adapter)).code == 0
