"""Megatron-Core torch_dist iteration dirs, checked against torch's DCP loader and Megatron's common.pt.

The shipped sample (sample_ckpts/megatron_torch_dist, written by megatron-core
``dist_checkpointing.save`` on 2 gloo ranks, TP=2) is the fixture; one test re-runs the writer
to prove the sample still matches it.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from dist_reference import MEGATRON_ITER, assert_no_torch_on_metadata_path, generators, torch_dcp_tensors, values

from ckptscope.cli import main as cli_main
from ckptscope.core.errors import MissingTensor
from ckptscope.formats import open_checkpoint
from ckptscope.formats.megatron.dist_reader import MegatronDistReader, stacked_view_name
from ckptscope.formats.registry import detect_format

QKV = "decoder.layers.self_attention.linear_qkv.weight"
FC1 = "decoder.layers.mlp.linear_fc1.weight"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return torch_dcp_tensors(MEGATRON_ITER)


@pytest.fixture()
def reader():
    with open_checkpoint(MEGATRON_ITER) as r:
        yield r


def test_detected_as_megatron_dist(reader):
    assert detect_format(MEGATRON_ITER) is MegatronDistReader
    index = reader.index()
    assert index.format == "megatron_dist"
    assert index.metadata["megatron"]["sharded_backend"] == "torch_dist"
    roles = {f.path: f.role for f in index.files}
    assert roles["common.pt"] == "common" and roles["metadata.json"] == "metadata"
    assert sum(1 for r in roles.values() if r == "data") == 4  # __{rank}_{k}.distcp, 2 ranks x 2 threads


def test_every_stored_tensor_matches_torch_loader(reader, expected):
    index = reader.index()
    assert set(index.tensors) == set(expected)
    for name, want in expected.items():
        got = reader.read(name)
        assert got.dtype == index.tensors[name].dtype_info.numpy(), name
        np.testing.assert_array_equal(values(got), want, err_msg=name)


def test_tp_shards_are_real_chunks(reader):
    qkv = reader.meta(QKV)
    assert qkv.shape == (2, 128, 64)  # [L, (nq + 2 nkv) d, H]
    assert sorted(c.offsets for c in qkv.chunks) == [(0, 0, 0), (0, 64, 0), (1, 0, 0), (1, 64, 0)]
    assert len(qkv.files) >= 2
    proj = reader.meta("decoder.layers.self_attention.linear_proj.weight")
    assert {c.offsets[2] for c in proj.chunks} == {0, 32}  # row-parallel: split on the input axis


def test_region_reads_across_tp_chunks(reader, expected):
    full = expected[QKV]
    np.testing.assert_array_equal(values(reader.read(QKV, (slice(0, 2), slice(60, 70), slice(5, 9)))),
                                  full[0:2, 60:70, 5:9])
    emb = expected["embedding.word_embeddings.weight"]
    np.testing.assert_array_equal(values(reader.read("embedding.word_embeddings.weight", (slice(120, 136),))),
                                  emb[120:136])


def test_per_layer_views_equal_slices_of_the_stacked_tensor(reader, expected):
    index = reader.index()
    assert index.views["decoder.layers.1.mlp.linear_fc1.weight"] == (FC1, 1)
    stacked = [n for n in index.tensors if stacked_view_name(n)]
    assert len(index.views) == 2 * len(stacked)
    for view, (stored, layer) in index.views.items():
        assert view not in index.tensors
        np.testing.assert_array_equal(values(reader.read(view)), expected[stored][layer], err_msg=view)
    # Views of optimizer state too, with the layer index in the same place.
    assert ("optimizer.state.exp_avg.decoder.layers.0.self_attention.linear_qkv.weight" in index.views)
    meta = reader.meta("decoder.layers.1.self_attention.linear_qkv.weight")
    assert meta.shape == (128, 64) and meta.attr("view_of") == QKV and meta.attr("layer") == "1"
    assert sorted(c.offsets for c in meta.chunks) == [(0, 0), (64, 0)]
    region = reader.read("decoder.layers.0.self_attention.linear_qkv.weight", (slice(60, 70),))
    np.testing.assert_array_equal(values(region), expected[QKV][0, 60:70])
    with pytest.raises(MissingTensor):
        reader.read("decoder.layers.2.self_attention.linear_qkv.weight")


def test_logical_tensors_replace_stacks_by_layers(reader):
    index = reader.index()
    logical = index.logical_tensors()
    assert QKV not in logical and "decoder.layers.0.self_attention.linear_qkv.weight" in logical
    assert "embedding.word_embeddings.weight" in logical
    assert sum(t.numel for t in logical.values()) == index.num_params  # views re-count nothing
    assert index.tensors[QKV].attr("stacked_layers") == "2"


def test_common_state_objects(reader):
    import torch

    index = reader.index()
    objects = {o.name: o for o in index.objects}
    assert index.iteration == 10 and index.metadata["checkpoint_version"] == 3.0
    common = torch.load(MEGATRON_ITER / "common.pt", weights_only=False)
    args = objects["args"]
    assert args.type == "argparse.Namespace"
    assert {k: v for k, v in args.value.items() if k != "__class__"} == vars(common["args"])
    assert objects["iteration"].value == common["iteration"] == 10
    assert objects["optimizer"].value["param_groups"][0]["lr"] == common["optimizer"]["param_groups"][0]["lr"]
    # ShardedObjects: rng state per (pp, tp) rank, TE-style _extra_state per layer.
    assert "rng_state/shard_0.1_1.2" in objects
    assert objects["rng_state/shard_0.0_1.2"].value[0][0]["torch_rng_state"].startswith("<Tensor uint8")
    assert "decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2" in objects


def test_optimizer_state_is_grouped_apart(reader):
    index = reader.index()
    for name, meta in index.tensors.items():
        assert meta.attr("group") == ("optimizer" if name.startswith("optimizer.") else "model"), name
    groups = index.metadata["groups"]
    assert groups["optimizer"]["tensors"] == 16 and groups["model"]["tensors"] == 8
    assert groups["optimizer"]["params"] == 2 * groups["model"]["params"]  # exp_avg + exp_avg_sq


def test_metadata_path_imports_no_torch_or_megatron():
    assert_no_torch_on_metadata_path(MEGATRON_ITER, read="decoder.layers.1.mlp.linear_fc1.weight")


def test_inspect_json(capsys):
    cli_main(["inspect", str(MEGATRON_ITER), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "megatron_dist"
    assert doc["metadata"]["iteration"] == 10
    assert doc["metadata"]["groups"]["optimizer"]["tensors"] == 16
    assert {"args", "iteration", "checkpoint_version"} <= {o["name"] for o in doc["objects"]}
    shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
    assert shapes[FC1] == [2, 128, 64]


def test_missing_common_and_incomplete_save(tmp_path):
    target = tmp_path / "iter_0000042"
    shutil.copytree(MEGATRON_ITER, target)
    (target / "common.pt").unlink()
    index = open_checkpoint(target).index()
    assert index.iteration == 42  # from the directory name
    assert any("common" in w for w in index.warnings)
    (target / ".metadata").unlink()
    index = open_checkpoint(target).index()  # incomplete: nothing to index, but still recognised
    assert index.format == "megatron_dist" and not index.tensors
    assert [(i.kind, i.file) for i in index.issues] == [("missing-marker", ".metadata")]
    assert any(w.startswith(".metadata: not found") for w in index.warnings)


def test_zarr_marker_is_claimed_to_be_refused_by_name(tmp_path):
    """A zarr-backend save is this reader's to refuse by name (tests/test_megatron_versions.py runs the
    CLI on one); a broken marker is nobody's."""
    (tmp_path / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    assert MegatronDistReader.supports(tmp_path)
    (tmp_path / "metadata.json").write_text("{not json")
    assert not MegatronDistReader.supports(tmp_path)


def test_shipped_sample_matches_a_fresh_megatron_save(tmp_path):
    """The writer is deterministic: megatron-core re-saves the same keys, chunks and values."""
    fresh = generators().write_megatron_torch_dist(tmp_path) / "iter_0000010"
    assert (fresh.parent / "latest_checkpointed_iteration.txt").read_text() == "10"
    shipped = open_checkpoint(MEGATRON_ITER)
    new = open_checkpoint(fresh)
    layout = lambda ix: {n: (t.shape, sorted(c.offsets for c in t.chunks)) for n, t in ix.tensors.items()}
    assert layout(shipped.index()) == layout(new.index())
    for name in shipped.index().tensors:
        np.testing.assert_array_equal(values(shipped.read(name)), values(new.read(name)), err_msg=name)


def test_per_layer_keys_are_not_stacked():
    assert stacked_view_name("decoder.layers.3.mlp.linear_fc1.weight") is None
    assert stacked_view_name("decoder.final_layernorm.weight") is None
    assert stacked_view_name("decoder.layers.mlp.experts.experts.linear_fc1.weight") == \
        ("decoder.layers", "mlp.experts.experts.linear_fc1.weight")
    assert stacked_view_name("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight") == \
        ("optimizer.state.exp_avg.decoder.layers", "mlp.linear_fc2.weight")


def test_old_mcore_metadata_class_and_flattened_tensors(tmp_path):
    """core 0.15 pickled ``MCoreMetadata`` (0.8-0.14 added ``mcore_data``); both must open without Megatron."""
    import pickle

    from megatron.core.dist_checkpointing.strategies.torch import MCoreMetadata
    from torch.distributed.checkpoint import FileSystemReader

    target = tmp_path / "iter_0000010"
    shutil.copytree(MEGATRON_ITER, target)
    old = MCoreMetadata()
    old.__dict__.update(vars(FileSystemReader(str(MEGATRON_ITER)).read_metadata()))
    old.mcore_data = {FC1: {"nd_reformulated_orig_global_shape": (2, 128, 64)}}
    (target / ".metadata").write_bytes(pickle.dumps(old))
    with open_checkpoint(target) as reader:
        index = reader.index()
        assert index.tensors[FC1].attr("orig_global_shape") == "[2, 128, 64]"
        assert any("flattened" in w for w in index.warnings)
        assert reader.read(FC1).shape == (2, 128, 64)


def test_views_work_on_any_reader_and_multi_layer_chunks(tmp_path):
    """The view mechanism lives in core/base: a stored chunk holding several layers is sliced too."""
    from safetensors.numpy import save_file

    stacked = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    save_file({"layers.w": stacked}, str(tmp_path / "s.safetensors"))
    with open_checkpoint(tmp_path / "s.safetensors") as reader:
        index = reader.index()
        index.views.update({f"layers.{i}.w": ("layers.w", i) for i in range(4)})
        np.testing.assert_array_equal(reader.read("layers.2.w"), stacked[2])
        np.testing.assert_array_equal(reader.read("layers.3.w", (slice(1, 3), slice(1, 2))), stacked[3, 1:3, 1:2])
        meta = reader.meta("layers.1.w")
        assert meta.shape == (3, 2) and meta.chunks[0].shape == (3, 2) and meta.chunks[0].offsets == (0, 0)
        assert list(index.logical_tensors()) == [f"layers.{i}.w" for i in range(4)]


def test_common_state_sharded_object_without_common_pt(tmp_path):
    """core 0.19+ layout: no common.pt; the common dict is a torch.save'd [dict] bytes entry.

    megatron-core 0.16 cannot write it, so it is built here with torch DCP + Megatron's planner."""
    import argparse
    import io

    import torch
    import torch.distributed.checkpoint as dcp

    blob = io.BytesIO()
    torch.save([{"args": argparse.Namespace(num_layers=2), "iteration": 77, "checkpoint_version": 3.0}], blob)
    blob.seek(0)
    target = tmp_path / "iter_0000077"
    from megatron.core.dist_checkpointing.strategies.torch import MCoreSavePlanner

    # Megatron's planner writes ShardedObject bytes verbatim, as dist_checkpointing does.
    dcp.save({"decoder.layers.mlp.linear_fc2.weight": torch.arange(12.0).reshape(2, 3, 2),
              "common_state/shard_0_1": blob}, checkpoint_id=str(target), no_dist=True,
             planner=MCoreSavePlanner(flatten_state_dict=False, can_run_decentralized_global_plan=False))
    (target / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    with open_checkpoint(target) as reader:
        index = reader.index()
        objects = {o.name: o.value for o in index.objects}
        assert index.iteration == 77 and objects["args"]["num_layers"] == 2
        assert "common_state/shard_0_1" not in objects
        np.testing.assert_array_equal(reader.read("decoder.layers.1.mlp.linear_fc2.weight"),
                                      np.arange(6.0, 12.0).reshape(3, 2))
