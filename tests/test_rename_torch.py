"""Renaming torch pickles: the object tree is written back safely, storages copied verbatim."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from ckptscope.formats import open_checkpoint


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and \
        a.contiguous().reshape(-1).view(torch.uint8).tolist() == b.contiguous().reshape(-1).view(torch.uint8).tolist()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_training_checkpoint_rename_keeps_everything_else(samples, tmp_path, cli):
    src = samples["megatron_style.pt"]
    before = sha(src)
    dst = tmp_path / "renamed.pt"
    result = cli("rename", str(src), str(dst), "--sub", r"^model\.model\.", "model.backbone.",
                 "--drop", r"layers\.3\.", "--drop", r"^optimizer\.state\.")
    assert result.code == 0, result.err
    assert sha(src) == before
    original = torch.load(src, weights_only=False)
    for renamed in (torch.load(dst, weights_only=False), torch.load(dst, weights_only=False, mmap=True)):
        assert list(renamed) == list(original)  # top-level order kept
        expected = {k.replace("model.", "backbone.", 1): v for k, v in original["model"].items() if ".layers.3." not in k}
        assert list(renamed["model"]) == list(expected)
        for key, tensor in expected.items():
            assert same_bits(renamed["model"][key], tensor)
        assert isinstance(renamed["args"], argparse.Namespace) and vars(renamed["args"]) == vars(original["args"])
        assert renamed["iteration"] == 20 and renamed["checkpoint_version"] == 3.0
        assert renamed["optimizer"]["state"] == {0: {}}
        assert renamed["optimizer"]["param_groups"] == original["optimizer"]["param_groups"]
        assert same_bits(renamed["rng_state"][0]["torch_rng_state"], original["rng_state"][0]["torch_rng_state"])
        assert renamed["rng_state"][0]["random_rng_state"] == original["rng_state"][0]["random_rng_state"]
        view = renamed["extra.transposed_view"]
        assert same_bits(view, original["extra.transposed_view"]) and view.stride() == (1, 4)
    # Storages only dropped tensors used are gone from the archive.
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst) as b:
        count = lambda z: sum(1 for n in z.namelist() if "/data/" in n)  # noqa: E731
        # Every tensor of this file has its own storage: 9 of layer 3 and step/exp_avg/exp_avg_sq went.
        assert count(b) == count(a) - 9 - 3


def test_legacy_file_rename(samples, tmp_path, cli):
    src = samples["legacy_format.pt"]
    dst = tmp_path / "legacy_renamed.pt"
    assert cli("rename", str(src), str(dst), "--sub", "^encoder", "enc", "--drop", "^steps$").code == 0
    original, renamed = torch.load(src), torch.load(dst)
    assert dst.read_bytes()[:16] == src.read_bytes()[:16]  # still the legacy magic
    assert set(renamed) == {"enc.weight", "enc.bias", "decoder.weight"}
    assert same_bits(renamed["enc.weight"], original["encoder.weight"])
    assert same_bits(renamed["decoder.weight"], original["decoder.weight"])
    assert open_checkpoint(dst).index().format == "torch-legacy"


def test_hf_bin_dir_rename(samples, tmp_path, cli):
    src = samples["hf_llama_bin"]
    dst = tmp_path / "bin_renamed"
    assert cli("rename", str(src), str(dst), "--sub", r"\.mlp\.", ".ffn.").code == 0
    index = json.loads((dst / "pytorch_model.bin.index.json").read_text())
    originals = {}
    for shard in sorted(src.glob("pytorch_model-*.bin")):
        originals.update(torch.load(shard, weights_only=True))
    seen = {}
    for shard in sorted(dst.glob("pytorch_model-*.bin")):
        for name, tensor in torch.load(shard, weights_only=True).items():
            assert index["weight_map"][name] == shard.name
            seen[name] = tensor
    assert set(seen) == {k.replace(".mlp.", ".ffn.") for k in originals}
    for name, tensor in originals.items():
        assert same_bits(seen[name.replace(".mlp.", ".ffn.")], tensor)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in seen.values())


def test_moving_a_tensor_out_of_its_dict_is_refused_before_writing(samples, tmp_path, cli):
    dst = tmp_path / "never.pt"
    result = cli("rename", str(samples["megatron_style.pt"]), str(dst), "--sub", r"^model\.model\.", "backbone.")
    assert result.code == 2 and "must keep the 'model' prefix" in result.err
    assert result.out == "" and not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_rename_never_runs_pickled_code_and_keeps_the_object(tmp_path, cli):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    src = tmp_path / "evil.pt"
    torch.save({"w": torch.arange(3.0), "evil": Payload()}, src)
    dst = tmp_path / "evil_renamed.pt"
    assert cli("rename", str(src), str(dst), "--sub", "^w$", "weight").code == 0
    assert not marker.exists()
    index = open_checkpoint(dst).index()
    assert "weight" in index.tensors
    assert next(o for o in index.objects if o.name == "evil").type.endswith(".system")
    assert not marker.exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.uint16])
def test_v2_and_v3_tensors_survive(tmp_path, cli, dtype):
    src = tmp_path / "d.pt"
    value = torch.arange(12, dtype=torch.int32).to(dtype).reshape(3, 4)
    torch.save({"a": value, "p": torch.nn.Parameter(torch.ones(2), requires_grad=False)}, src)
    dst = tmp_path / "d2.pt"
    assert cli("rename", str(src), str(dst), "--sub", "^a$", "b").code == 0
    out = torch.load(dst, weights_only=True)
    assert same_bits(out["b"], value)
    assert isinstance(out["p"], torch.nn.Parameter) and out["p"].requires_grad is False


def test_shared_storage_stays_shared(tmp_path, cli):
    emb = torch.randn(6, 3)
    src = tmp_path / "tied.pt"
    torch.save({"embed": emb, "head": emb}, src)
    dst = tmp_path / "tied2.pt"
    assert cli("rename", str(src), str(dst), "--sub", "^head$", "lm_head").code == 0
    out = torch.load(dst, weights_only=True)
    assert out["embed"].data_ptr() == out["lm_head"].data_ptr()
    assert same_bits(out["lm_head"], emb)


def test_source_untouched_and_copy_identical_without_changes(samples, tmp_path):
    src = tmp_path / "copy.pt"
    shutil.copy2(samples["megatron_style.pt"], src)
    before = sha(src)
    from ckptscope.ops.rename.engine import execute_rename, plan_rename

    plan = plan_rename(src, tmp_path / "out.pt", subs=[(r"^extra\.", "extras.")])
    execute_rename(plan)
    assert sha(src) == before
    assert "extras.transposed_view" in open_checkpoint(tmp_path / "out.pt").index().tensors


def test_drop_blanks_the_bytes_of_a_view_into_a_shared_storage(tmp_path):
    """DeepSpeed's zero_to_fp32 ``.bin`` (shipped, written by DeepSpeed) keeps every tensor as a slice of
    one flat storage, which rename copies whole: a dropped tensor's values stayed in the file. They
    are now zeros there; what is kept reads back (torch.load) equal to the source."""
    from tests.conftest import run_cli

    src = Path(__file__).resolve().parents[1] / "sample_ckpts" / "deepspeed_zero" / "zero2_fp32_bin"
    out = tmp_path / "renamed"
    result = run_cli("rename", str(src), str(out), "--drop", r"layers\.1\.mlp")
    assert result.code == 0, result.err
    before = torch.load(str(src / "pytorch_model.bin"), weights_only=True)
    after = torch.load(str(out / "pytorch_model.bin"), weights_only=True)
    dropped = [n for n in before if "layers.1.mlp" in n]
    assert len(dropped) == 3 and set(after) == set(before) - set(dropped)
    for name, value in after.items():
        assert torch.equal(value, before[name]), name
    for name in dropped:
        ref = before[name]
        # a kept tensor of the same flat storage (one per DeepSpeed param group) carries it into the output
        sharer = next(n for n in after if before[n].untyped_storage().data_ptr() == ref.untyped_storage().data_ptr())
        flat = bytes(after[sharer].untyped_storage())
        size = ref.element_size()
        assert ref.abs().sum() > 0
        assert not any(flat[ref.storage_offset() * size:(ref.storage_offset() + ref.numel()) * size]), name
