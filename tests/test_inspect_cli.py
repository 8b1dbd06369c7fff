"""``ckptscope inspect``: the human view and the one-object JSON document."""

from __future__ import annotations

import json
import math

from safetensors.torch import load_file


def test_json_document_schema_and_values(samples, cli):
    path = samples["hf_llama_sharded"]
    result = cli("inspect", "--json", str(path))
    assert result.code == 0, result.err
    doc = json.loads(result.out)  # exactly one JSON object on stdout
    assert set(doc) == {"path", "format", "layout", "tensors", "objects", "metadata"}
    assert doc["path"] == str(path) and doc["format"] == "hf" and doc["layout"] == "Hugging Face model dir"
    expected = {}
    for shard in sorted(path.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            expected[name] = (tensor, shard.name)
    assert {t["name"] for t in doc["tensors"]} == set(expected)
    for entry in doc["tensors"]:
        tensor, shard = expected[entry["name"]]
        assert set(entry) == {"name", "dtype", "shape", "nbytes", "chunks", "role"}
        assert entry["dtype"] == "bfloat16" and entry["role"] == "model"
        assert entry["shape"] == list(tensor.shape)
        assert entry["nbytes"] == tensor.numel() * 2
        assert entry["chunks"] == [{"offsets": [0] * tensor.dim(), "shape": list(tensor.shape), "file": shard}]
    assert {o["name"]: o["type"] for o in doc["objects"]} == {"config": "json", "generation_config": "json"}
    assert doc["metadata"]["num_params"] == sum(t.numel() for t, _ in expected.values())
    assert doc["metadata"]["bytes_per_dtype"] == {"bfloat16": 2 * doc["metadata"]["num_params"]}


def test_json_objects_of_a_training_checkpoint(samples, cli):
    doc = json.loads(cli("inspect", "--json", str(samples["megatron_style.pt"])).out)
    types = {o["name"]: o["type"] for o in doc["objects"]}
    assert types["args"] == "argparse.Namespace"
    assert types["iteration"] == "int" and doc["metadata"]["iteration"] == 20
    assert types["optimizer.param_groups"] == "list"
    roles = {t["name"]: t["role"] for t in doc["tensors"]}
    assert roles["model.model.embed_tokens.weight"] == "model" and roles["optimizer.state.0.exp_avg"] == "optimizer"
    assert roles["rng_state.0.torch_rng_state"] == "rng" and roles["extra.transposed_view"] == "unknown"
    split = doc["metadata"]["roles"]
    assert split["prefix"] == "model." and split["naming"] == "hf" and split["unknown"] == ["extra.transposed_view"]
    model_params = sum(t["nbytes"] // 4 for t in doc["tensors"] if t["role"] == "model")  # all float32
    assert doc["metadata"]["num_params"] == model_params == split["model"]["params"]
    assert split["training_state"]["optimizer"]["tensors"] == 3


def test_include_exclude_filters(samples, cli):
    path = str(samples["hf_llama_single"])
    doc = json.loads(cli("inspect", "--json", "--include", "*.self_attn.*", "--exclude", "*k_proj*", path).out)
    names = [t["name"] for t in doc["tensors"]]
    assert names and all(".self_attn." in n and "k_proj" not in n for n in names)
    assert len(names) == 4 * 3
    doc = json.loads(cli("inspect", "--json", "--include", "model.layers.1", path).out)
    assert {t["name"].split(".")[2] for t in doc["tensors"]} == {"1"}


def test_human_view_collapses_layers_and_sums(samples, cli):
    result = cli("inspect", str(samples["hf_llama_sharded"]))
    assert result.code == 0, result.err
    out = result.out
    assert "layers.[0-3]" in out and "×4" in out
    tensors = {}
    for shard in samples["hf_llama_sharded"].glob("*.safetensors"):
        tensors.update(load_file(shard))
    total = sum(t.numel() for t in tensors.values())
    assert f"({total:,})" in out
    assert "bfloat16" in out and "LlamaForCausalLM" in out
    assert "q_proj.weight" in out and "[64, 64]" in out
    assert "layers.[0-3]" not in cli("inspect", "--no-collapse", str(samples["hf_llama_sharded"])).out


def test_human_view_of_objects(samples, cli):
    out = cli("inspect", str(samples["megatron_style.pt"])).out
    assert "argparse.Namespace" in out and "iteration" in out and "20" in out


def test_trust_pickle_flag_reads_the_same_values(samples, cli):
    safe = json.loads(cli("inspect", "--json", str(samples["megatron_style.pt"])).out)
    trusted_run = cli("inspect", "--json", "--trust-pickle", str(samples["megatron_style.pt"]))
    trusted = json.loads(trusted_run.out)
    assert {(t["name"], t["dtype"], tuple(t["shape"])) for t in safe["tensors"]} == \
        {(t["name"], t["dtype"], tuple(t["shape"])) for t in trusted["tensors"]}
    assert "trust-pickle" in trusted_run.err  # the warning goes to stderr


def test_scalar_and_empty_tensors_in_json(samples, cli):
    doc = json.loads(cli("inspect", "--json", str(samples["dtypes.safetensors"])).out)
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert by_name["scalar.step"]["shape"] == [] and by_name["scalar.step"]["nbytes"] == 4
    assert by_name["empty.rows"]["shape"] == [0, 4] and by_name["empty.rows"]["nbytes"] == 0
    expected = load_file(samples["dtypes.safetensors"])
    assert doc["metadata"]["num_params"] == sum(math.prod(t.shape) for t in expected.values())
    assert doc["metadata"]["__metadata__"]["producer"] == "ckptscope samples"


def test_version_and_help(cli):
    assert cli("--version").out.startswith("ckptscope")
    assert "inspect" in cli("--help").out


def test_wide_modules_print_their_first_children_then_a_count(tmp_path, cli):
    """A module with 100 distinct children prints 40 and '… 60 more'; --all-children prints all."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "wide.safetensors"
    save_file({f"bank.item{i:03d}.weight": torch.full((2,), float(i)) for i in range(100)}, path)
    short = cli("inspect", str(path))
    assert short.code == 0, short.err
    assert "item039" in short.out and "item040" not in short.out and "… 60 more" in short.out
    full = cli("inspect", str(path), "--all-children")
    assert all(f"item{i:03d}" in full.out for i in range(100)) and "more" not in full.out


def test_training_state_tree_counts_elements_at_every_depth(samples, cli):
    """Adam moments are not parameters: the training-state tree says elements on every module row."""
    import torch

    out = cli("inspect", str(samples["megatron_style.pt"])).out
    tree = out[out.index("training state (not part of the model)"):out.index("objects")]
    state = torch.load(samples["megatron_style.pt"], weights_only=False)["optimizer"]["state"][0]
    moments = sum(t.numel() for t in state.values())
    row = next(line for line in tree.splitlines() if "optimizer.state.0" in line)
    assert f"{moments / 1000:.1f}K elements" in row and "params" not in tree
