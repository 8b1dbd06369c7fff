"""One rank's ``torch.save`` file of a sharded state dict, opened on its own (a probe: an FSDP1
SHARDED_STATE_DICT rank file failed with "cannot decode data.pkl: ... Stub[__builtin__.getattr]",
and an FSDP2 one read as 0 tensors). Written by FSDP itself on 2 gloo ranks; FSDP1's own
FULL_STATE_DICT is the reference for every piece."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from dist_reference import generators

from ckptscope.formats.registry import open_checkpoint
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory):
    return generators().write_fsdp_rank_files(tmp_path_factory.mktemp("fsdp_rank_files"))


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_a_rank_file_shows_global_tensors_with_its_own_pieces(rank_files, kind, tmp_path):
    import torch

    full = torch.load(rank_files / "fsdp1" / "full.pt", weights_only=True)
    files = sorted((rank_files / kind).glob("model_*rank*.pt"))
    assert len(files) == 2
    covered = {name: np.zeros(tuple(t.shape), bool) for name, t in full.items()}
    for file in files:
        data = json.loads(run_cli("inspect", "--json", str(file)).out)
        assert {t["name"]: tuple(t["shape"]) for t in data["tensors"]} == {n: tuple(t.shape) for n, t in full.items()}
        assert any("one rank's file of a sharded state dict" in w for w in data["metadata"]["warnings"])
        with open_checkpoint(file) as reader:
            for name, meta in reader.index().tensors.items():
                for chunk in meta.chunks:
                    region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.shape))
                    got = np.asarray(reader.read(name, region))
                    assert np.array_equal(got, full[name][region].numpy()), (file.name, name)
                    covered[name][region] = True
        check = run_cli("check", str(file))
        assert check.code == 1 and "hole" in check.out, check.out  # the other rank's parts
        refused = run_cli("convert", str(file), str(tmp_path / f"out_{file.stem}"), "--to", "hf", "--skip-unknown")
        assert refused.code == 2 and not (tmp_path / f"out_{file.stem}").exists(), refused.err
    assert all(mask.all() for mask in covered.values())  # the two files hold every element between them


def test_fsdp2_rank_files_in_verls_layout_are_the_whole_model(rank_files, tmp_path):
    """The same files as a set: verl's layout opens them as one model, equal to FSDP's full state dict."""
    import torch

    full = torch.load(rank_files / "fsdp1" / "full.pt", weights_only=True)
    actor = tmp_path / "actor"
    shutil.copytree(rank_files / "fsdp2", actor)
    with open_checkpoint(actor) as reader:
        tensors = reader.index().tensors
        assert set(tensors) == set(full)
        for name in full:
            assert np.array_equal(np.asarray(reader.read(name)), full[name].numpy()), name


def test_fsdp1_rank_files_under_accelerates_names_are_the_whole_model(rank_files, tmp_path):
    """accelerate's ``save_fsdp_model(..., use_dcp=False)`` under FSDP1 SHARDED_STATE_DICT is this same
    ``torch.save`` of each rank's ShardedTensor state dict, named ``pytorch_model_fsdp_0_rank{R}.bin``. The
    names carry no world size: it comes from the ShardedTensors' placements, so without rank 1's file its
    parts are holes (check exits 1), not a smaller model."""
    import torch

    full = torch.load(rank_files / "fsdp1" / "full.pt", weights_only=True)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        shutil.copy(rank_files / "fsdp1" / f"model_rank{rank}.pt", ranks / f"pytorch_model_fsdp_0_rank{rank}.bin")
    with open_checkpoint(ranks) as reader:
        index = reader.index()
        assert index.format == "accelerate_fsdp_ranks" and set(index.tensors) == set(full)
        assert index.metadata["accelerate_fsdp"]["world_size"] == 2
        for name in full:
            assert np.array_equal(np.asarray(reader.read(name)), full[name].numpy()), name
    assert run_cli("check", str(ranks)).code == 0
    (ranks / "pytorch_model_fsdp_0_rank1.bin").unlink()
    check = run_cli("check", str(ranks))
    assert check.code == 1 and "pytorch_model_fsdp_0_rank1.bin" in check.out, check.out
