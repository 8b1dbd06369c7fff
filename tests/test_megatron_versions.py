"""Megatron layouts that are read differently, or not at all, by what their files say of themselves.

* ``checkpoint_version`` < 2.0 (a missing one reads as 0): Megatron-LM's
  ``fix_query_key_value_ordering`` permutes the rows of pre-mcore ``query_key_value`` / ``key_value``
  tensors on load, and only those; mcore ``linear_qkv`` never. The warning follows that rule (before,
  it was given for mcore names, which Megatron does not permute, and not for a missing version).
* The zarr backend (``metadata.json`` ``sharded_backend: zarr``, removed in megatron-core 0.16): refused
  by name (before: "not a checkpoint ckptscope can read", and check called it an incomplete torch_dist).
"""

from __future__ import annotations

import json
import shutil

import torch

from tests.conftest import REPO, run_cli

LEGACY = REPO / "sample_ckpts" / "megatron_legacy_tp2"


def _warnings(path) -> list[str]:
    result = run_cli("inspect", "--json", str(path))
    assert result.code == 0, result.err
    return json.loads(result.out)["metadata"]["warnings"]


def _iteration(root):
    return next(p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter_"))


def test_old_checkpoint_version_warns_only_where_megatron_permutes(tmp_path):
    mcore = tmp_path / "mcore"
    shutil.copytree(LEGACY, mcore)
    for rank_file in _iteration(mcore).rglob("model_optim_rng.pt"):
        state = torch.load(rank_file, weights_only=False)
        state["checkpoint_version"] = 1.0
        torch.save(state, rank_file)
    assert not any("ordering" in w for w in _warnings(mcore))  # linear_qkv: Megatron never permutes it

    old = tmp_path / "old" / "iter_0000001" / "mp_rank_00"
    old.mkdir(parents=True)
    qkv = "language_model.encoder.layers.0.self_attention.query_key_value.weight"
    torch.save({"iteration": 1, "model": {"language_model": {"encoder": {
        "layers.0.self_attention.query_key_value.weight": torch.zeros(12, 4)}}}}, old / "model_optim_rng.pt")
    warnings = _warnings(old.parent)
    assert any("no checkpoint_version (read as 0)" in w and "query_key_value" in w for w in warnings), (qkv, warnings)


def test_zarr_backend_is_refused_by_name(tmp_path):
    """The layout megatron-core's zarr strategy wrote (strategies/zarr.py, core <= 0.15): metadata.json
    naming the backend, common.pt, one zarr v2 array dir per key."""
    iteration = tmp_path / "run" / "iter_0000003"
    (iteration / "embedding.word_embeddings.weight").mkdir(parents=True)
    (iteration / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr", "sharded_backend_version": 1,
                                                         "common_backend": "torch", "common_backend_version": 1}))
    (iteration / "embedding.word_embeddings.weight" / ".zarray").write_text(json.dumps(
        {"zarr_format": 2, "shape": [8, 4], "chunks": [8, 4], "dtype": "<f4", "compressor": None,
         "fill_value": None, "order": "C", "filters": None}))
    torch.save({"iteration": 3, "checkpoint_version": 3.0}, iteration / "common.pt")
    (tmp_path / "run" / "latest_checkpointed_iteration.txt").write_text("3")
    for target in (iteration, tmp_path / "run"):
        result = run_cli("inspect", str(target))
        assert result.code == 2 and "zarr backend" in result.err and result.err.count("\n") == 1, result.err
    result = run_cli("convert", str(iteration), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and "zarr" in result.err and not (tmp_path / "hf").exists()
