"""``rename``: tensor bytes copied verbatim under new names; plans are checked before writing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file


def tree_hashes(root: Path) -> dict[str, str]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def load_dir(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().reshape(-1).view(torch.uint8).tolist() == b.contiguous().reshape(-1).view(torch.uint8).tolist()


@pytest.fixture
def hf_copy(samples, tmp_path) -> Path:
    target = tmp_path / "src_hf"
    shutil.copytree(samples["hf_llama_sharded"], target)
    return target


def test_sharded_rename_and_drop(hf_copy, tmp_path, cli):
    before = tree_hashes(hf_copy)
    dst = tmp_path / "renamed"
    result = cli("rename", str(hf_copy), str(dst), "--sub", r"^model\.", "backbone.", "--drop", r"layers\.3\.")
    assert result.code == 0, result.err
    assert tree_hashes(hf_copy) == before, "the source changed"
    original, renamed = load_dir(hf_copy), load_dir(dst)
    expected_names = {n.replace("model.", "backbone.", 1) for n in original if ".layers.3." not in n}
    assert set(renamed) == expected_names
    for name, tensor in original.items():
        if ".layers.3." not in name:
            assert same_bits(renamed[name.replace("model.", "backbone.", 1)], tensor)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for name, shard in index["weight_map"].items():
        with safe_open(dst / shard, "pt") as handle:
            assert name in handle.keys()
            assert handle.metadata() == {"format": "pt"}  # __metadata__ preserved
    assert set(index["weight_map"]) == expected_names
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in renamed.values())
    assert (dst / "config.json").read_bytes() == (hf_copy / "config.json").read_bytes()


def test_round_trip_loads_in_transformers(hf_copy, tmp_path, cli):
    """Rename away and back: transformers loads the result and every weight is bit-identical."""
    from transformers import LlamaForCausalLM

    there, back = tmp_path / "there", tmp_path / "back"
    assert cli("rename", str(hf_copy), str(there), "--sub", r"\.self_attn\.", ".attention.").code == 0
    assert cli("rename", str(there), str(back), "--sub", r"\.attention\.", ".self_attn.").code == 0
    model = LlamaForCausalLM.from_pretrained(back)
    original = load_dir(hf_copy)
    state = model.state_dict()
    for name, tensor in original.items():
        assert same_bits(state[name], tensor), name


def test_single_file_with_map_and_metadata(samples, tmp_path, cli):
    src = samples["dtypes.safetensors"]
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"float32.matrix": "weights.main", "bool.mask": "weights.mask"}))
    dst = tmp_path / "out.safetensors"
    result = cli("rename", str(src), str(dst), "--map", str(mapping), "--drop", "^int8")
    assert result.code == 0, result.err
    original, renamed = load_file(src), load_file(dst)
    assert set(renamed) == (set(original) - {"float32.matrix", "bool.mask", "int8.codes"}) | {"weights.main",
                                                                                                "weights.mask"}
    assert same_bits(renamed["weights.main"], original["float32.matrix"])
    assert same_bits(renamed["scalar.step"], original["scalar.step"])
    with safe_open(dst, "pt") as a, safe_open(src, "pt") as b:
        assert a.metadata() == b.metadata()
    header_len = int.from_bytes(dst.read_bytes()[:8], "little")
    assert header_len % 8 == 0


@pytest.mark.parametrize("args,fragment", [
    ((r"--sub", r"layers\.\d+\.", "layers.X."), "names would collide"),
    ((r"--sub", r"^model\.norm\.weight$", "lm_head.weight"), "names would collide: 'lm_head.weight', 'model.norm.weight' -> 'lm_head.weight'"),
    ((r"--sub", r".*", ""), "empty name"),
    ((r"--sub", r"no_such_module", "x"), "pattern matches no tensor: --sub 'no_such_module'"),
    ((r"--drop", r"^nothing$"), "pattern matches no tensor: --drop '^nothing$'"),
    ((r"--sub", r"([", "x"), "not a valid regex"),
])
def test_bad_plans_write_nothing(hf_copy, tmp_path, cli, args, fragment):
    dst = tmp_path / "never"
    result = cli("rename", str(hf_copy), str(dst), *args)
    assert result.code == 2
    assert fragment in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src_hf"], "temp files left behind"


def test_map_with_unknown_name(hf_copy, tmp_path, cli):
    mapping = tmp_path / "m.json"
    mapping.write_text(json.dumps({"model.nope.weight": "x"}))
    result = cli("rename", str(hf_copy), str(tmp_path / "o"), "--map", str(mapping))
    assert result.code == 2 and "'model.nope.weight'" in result.err


def test_dry_run_writes_nothing(hf_copy, tmp_path, cli):
    dst = tmp_path / "dry"
    result = cli("rename", str(hf_copy), str(dst), "--sub", "q_proj", "query", "--dry-run", "--json")
    assert result.code == 0
    plan = json.loads(result.out)
    assert len(plan["renamed"]) == 4 and plan["dropped"] == [] and plan["dry_run"] is True
    assert all(r["new"].endswith("query.weight") for r in plan["renamed"])
    assert not dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src_hf"]


def test_existing_destination_needs_overwrite(hf_copy, tmp_path, cli):
    dst = tmp_path / "exists"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    result = cli("rename", str(hf_copy), str(dst), "--sub", "q_proj", "query")
    assert result.code == 2 and "--overwrite" in result.err
    assert (dst / "keep.txt").read_text() == "mine"
    assert cli("rename", str(hf_copy), str(dst), "--sub", "q_proj", "query", "--overwrite").code == 0
    assert not (dst / "keep.txt").exists()
    assert any(".query." in n for n in load_dir(dst))


def test_destination_inside_source_refused(hf_copy, cli):
    result = cli("rename", str(hf_copy), str(hf_copy / "sub"), "--sub", "q_proj", "query")
    assert result.code == 2 and "inside" in result.err
