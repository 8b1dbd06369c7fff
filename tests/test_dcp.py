"""Plain PyTorch DCP directories, checked against torch's own DCP loader.

Single-process samples are written fresh by the generator into a temporary directory; the
2-rank FSDP2 sample is the shipped one (spawning ranks takes seconds), verified against torch's
loader here and re-generated once to prove it still matches its writer.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dist_reference import (
    SAMPLES,
    as_numpy,
    assert_no_torch_on_metadata_path,
    generators,
    torch_dcp_tensors,
    values,
)

from ckptscope.cli import main as cli_main
from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import Encoding
from ckptscope.formats import open_checkpoint
from ckptscope.formats.dcp.reader import DcpReader, tensor_group
from ckptscope.formats.rangeio import RangeIO
from ckptscope.formats.registry import detect_format

FSDP2 = SAMPLES / "dcp_fsdp2"


@pytest.fixture(scope="session")
def single_process(tmp_path_factory) -> dict[str, Path]:
    """dcp_nested and dcp_safetensors written by torch.distributed.checkpoint in this process."""
    out = tmp_path_factory.mktemp("dcp")
    gen = generators()
    return {"nested": gen.write_dcp_nested(out), "safetensors": gen.write_dcp_safetensors(out)}


def _assert_matches_torch(path: Path) -> int:
    expected = torch_dcp_tensors(path)
    with open_checkpoint(path) as reader:
        index = reader.index()
        by_key = {meta.attr("dcp_key") or name: name for name, meta in index.tensors.items()}
        assert set(by_key) == set(expected)
        for key, want in expected.items():
            got = reader.read(by_key[key])
            assert got.shape == want.shape, key
            np.testing.assert_array_equal(values(got), want, err_msg=key)
    return len(expected)


def test_detected_as_plain_dcp(single_process):
    for path in (FSDP2, single_process["nested"], single_process["safetensors"]):
        assert detect_format(path) is DcpReader
        assert open_checkpoint(path).index().format == "dcp"


def test_fsdp2_values_match_torch_loader():
    assert _assert_matches_torch(FSDP2) == 17


def test_nested_values_match_torch_loader(single_process):
    assert _assert_matches_torch(single_process["nested"]) == 9


def test_fsdp2_uneven_shards_and_replicated_tensor():
    index = open_checkpoint(FSDP2).index()
    weight = index.tensors["model.0.weight"]
    assert weight.shape == (5, 4)
    assert [(c.offsets, c.shape) for c in weight.chunks] == [((0, 0), (3, 4)), ((3, 0), (2, 4))]
    assert weight.files == ("__0_0.distcp", "__1_0.distcp")
    assert all(c.encoding is Encoding.TORCH_ZIP_ITEM and c.byte_length > 0 for c in weight.chunks)
    replicated = index.tensors["extra.replicated"]
    assert len(replicated.chunks) == 1 and replicated.chunks[0].shape == (2, 3)
    assert index.metadata["dcp"]["serialization"] == "torch_save"
    assert {f.path for f in index.files} == {".metadata", "__0_0.distcp", "__1_0.distcp"}


def test_region_reads_across_chunk_boundaries():
    expected = torch_dcp_tensors(FSDP2)
    with open_checkpoint(FSDP2) as reader:
        full = expected["model.0.weight"]
        np.testing.assert_array_equal(reader.read("model.0.weight", (slice(2, 5), slice(1, 3))), full[2:5, 1:3])
        np.testing.assert_array_equal(reader.read("model.0.weight", (slice(3, 4),)), full[3:4])
        np.testing.assert_array_equal(reader.read("model.2.bias", (slice(1, 3),)), expected["model.2.bias"][1:3])
        assert reader.read("model.0.weight", (slice(2, 2),)).shape == (0, 4)
        # A 0-d tensor (the optimizer step) is one chunk with no axes.
        assert reader.read("optim.state.0.weight.step").shape == ()


def test_planner_names_groups_and_objects(single_process):
    index = open_checkpoint(single_process["nested"]).index()
    assert index.metadata["dcp"]["planner_data"] is True
    assert "model.layers.1.weight" in index.tensors
    assert index.tensors["optimizer.state.0.momentum_buffer"].attr("group") == "optimizer"
    assert index.tensors["model.embed.weight"].attr("group") == "model"
    assert index.metadata["groups"]["optimizer"]["tensors"] == 3
    assert index.metadata["groups"]["model"]["tensors"] == 6
    objects = {o.name: o.value for o in index.objects}
    assert objects["step"] == 5
    assert objects["optimizer.param_groups.0.lr"] == 0.1
    assert objects["optimizer.param_groups.0.params"] == [0, 1, 2, 3, 4]
    fsdp = open_checkpoint(FSDP2).index()
    assert {o.name: o.value for o in fsdp.objects}["train_state.tokens_seen"] == 4096
    assert fsdp.metadata["groups"]["optimizer"]["tensors"] == 12


def test_tensor_group_names():
    assert tensor_group("optimizer.state.exp_avg.decoder.final_layernorm.weight") == "optimizer"
    assert tensor_group("chained_1.optimizer.distributed.dp_group_idx_0.bucket_idx_0.param") == "optimizer"
    assert tensor_group("optim.state.layers.0.weight.exp_avg") == "optimizer"
    assert tensor_group("model.optimizer_head.weight") == "model"


def test_safetensors_serialisation_is_detected_and_read(single_process):
    path = single_process["safetensors"]
    state = generators().safetensors_state()
    with open_checkpoint(path) as reader:
        index = reader.index()
        assert index.metadata["dcp"]["serialization"] == "safetensors"
        assert "SAFETENSORS" in index.metadata["dcp"]["note"]
        assert all(c.encoding is Encoding.RAW for t in index for c in t.chunks)
        np.testing.assert_array_equal(values(reader.read("model.w")), as_numpy(state["model"]["w"]))
        np.testing.assert_array_equal(values(reader.read("model.b")), as_numpy(state["model"]["b"]))
        assert reader.read("model.w", (slice(1, 2), slice(2, 4))).shape == (1, 2)
        assert {o.name: o.value for o in index.objects} == {"step": 2}


def test_metadata_path_imports_no_torch(single_process):
    assert_no_torch_on_metadata_path(FSDP2, read="model.0.weight")
    assert_no_torch_on_metadata_path(single_process["safetensors"], read="model.w")


def test_inspect_json(capsys):
    cli_main(["inspect", str(FSDP2), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "dcp"
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert [c["offsets"] for c in tensors["model.0.weight"]["chunks"]] == [[0, 0], [3, 0]]
    assert doc["metadata"]["groups"]["model"]["tensors"] == 5
    assert "train_state.step" in {o["name"] for o in doc["objects"]}


def test_inspect_human_view_runs():
    result = subprocess.run([sys.executable, "-m", "ckptscope", "inspect", str(FSDP2)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "dcp" in result.stdout and "optim" in result.stdout


# --- damaged checkpoints: one-line errors, warnings for what can still be browsed ---------------


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(FSDP2, target)
    return target


def test_missing_data_file_is_a_warning_then_a_read_error(tmp_path):
    path = _copy(tmp_path)
    (path / "__1_0.distcp").unlink()
    with open_checkpoint(path) as reader:
        index = reader.index()
        assert any("__1_0.distcp" in w and "missing" in w for w in index.warnings)
        assert len(index.tensors) == 17
        with pytest.raises(CkptError, match="__1_0.distcp"):
            reader.read("model.0.weight")
        assert reader.read("model.0.weight", (slice(0, 3),)).shape == (3, 4)  # rank 0's chunk is fine


def test_truncated_data_file(tmp_path):
    path = _copy(tmp_path)
    data = (path / "__1_0.distcp").read_bytes()
    (path / "__1_0.distcp").write_bytes(data[: len(data) // 2])
    with open_checkpoint(path) as reader:
        assert any("truncated" in w for w in reader.index().warnings)
        with pytest.raises(CkptError, match="truncated"):
            reader.read("extra.replicated")  # written by the last rank, at the end of its file


def test_corrupt_item_is_a_ckpt_error(tmp_path):
    path = _copy(tmp_path)
    reader = open_checkpoint(path)
    chunk = reader.index().tensors["model.0.bias"].chunks[0]
    raw = bytearray((path / chunk.file).read_bytes())
    raw[chunk.byte_offset:chunk.byte_offset + chunk.byte_length] = b"\x00" * chunk.byte_length
    (path / chunk.file).write_bytes(bytes(raw))
    with pytest.raises(CkptError) as err:
        reader.read("model.0.bias")
    assert "model.0.bias" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content", [b"", b"not a pickle at all", pickle.dumps({"a": 1}), b"\x80\x04K\x01."])
def test_garbage_metadata(tmp_path, content):
    path = _copy(tmp_path)
    (path / ".metadata").write_bytes(content)
    with pytest.raises(CkptError) as err:
        open_checkpoint(path).index()
    assert ".metadata" in str(err.value)


def test_malicious_metadata_runs_nothing(tmp_path):
    path = _copy(tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (__import__("os").system, (f"touch {marker}",))

    (path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CkptError):
        open_checkpoint(path).index()
    assert not marker.exists()


def test_cli_error_is_one_line(tmp_path):
    path = _copy(tmp_path)
    (path / ".metadata").write_bytes(b"garbage")
    result = subprocess.run([sys.executable, "-m", "ckptscope", "inspect", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and ".metadata" in result.stderr
    assert "Traceback" not in result.stderr


def test_range_io_is_a_seekable_window():
    view = RangeIO(b"0123456789", 2, 5)
    assert view.read(2) == b"23"
    view.seek(-1, io.SEEK_END)
    assert view.read() == b"6"
    view.seek(1)
    assert view.tell() == 1 and view.read(100) == b"3456"


def test_shipped_fsdp2_sample_matches_a_fresh_save(tmp_path):
    """The writer is deterministic: a fresh 2-rank save has the same layout and values."""
    fresh = generators().write_dcp_fsdp2(tmp_path)
    shipped, new = open_checkpoint(FSDP2).index(), open_checkpoint(fresh).index()
    assert {n: (t.shape, [(c.offsets, c.shape) for c in t.chunks]) for n, t in shipped.tensors.items()} == \
        {n: (t.shape, [(c.offsets, c.shape) for c in t.chunks]) for n, t in new.tensors.items()}
    assert _assert_matches_torch(fresh) == 17


def test_bytesio_leaf_saved_by_the_default_planner_is_unwrapped(tmp_path):
    """The default planner torch.saves an io.BytesIO leaf; its payload (a torch.save) is decoded."""
    import torch
    import torch.distributed.checkpoint as dcp

    blob = io.BytesIO()
    torch.save({"epoch": 4, "name": "run-1"}, blob)
    blob.seek(0)
    dcp.save({"w": torch.ones(2), "extra_state": blob}, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    objects = {o.name: o.value for o in open_checkpoint(tmp_path / "ck").index().objects}
    assert objects["extra_state"] == {"epoch": 4, "name": "run-1"}


# --- HuggingFaceStorageWriter(save_distributed=True): per-rank safetensors pieces --------------------


@pytest.fixture(scope="module")
def hf_storage_shards(tmp_path_factory) -> Path:
    return generators().write_hf_storage_shards(tmp_path_factory.mktemp("hf_storage"))


def test_hf_storage_shards_are_whole_tensors_as_torch_reads_them(hf_storage_shards, tmp_path):
    """Each rank's pieces carry their global offsets in DCP_SHARDING_INFO; the tensors are what
    torch's own HuggingFaceStorageReader loads, and what was saved."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    saved = generators().hf_storage_state()
    assert sorted(p.name for p in hf_storage_shards.glob("shard-*.safetensors")) == [
        "shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]
    loaded = {name: torch.empty_like(t) for name, t in saved.items()}
    dcp.load(loaded, storage_reader=HuggingFaceStorageReader(str(hf_storage_shards)), no_dist=True)
    result = subprocess.run([sys.executable, "-m", "ckptscope", "inspect", "--json", str(hf_storage_shards)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    tensors = {t["name"]: t for t in json.loads(result.stdout)["tensors"]}
    assert {n: tuple(t["shape"]) for n, t in tensors.items()} == {n: tuple(t.shape) for n, t in saved.items()}
    assert len(tensors["model.embed_tokens.weight"]["chunks"]) == 2
    with open_checkpoint(hf_storage_shards) as reader:
        for name, want in saved.items():
            assert torch.equal(loaded[name], want), name  # torch's reader: the pieces make the saved tensor
            got = reader.read(name)
            want_bits = want.contiguous().view(-1).view(torch.uint8).numpy()
            assert np.array_equal(np.ascontiguousarray(got).reshape(-1).view(np.uint8), want_bits), name
    out = tmp_path / "merged"
    merged = subprocess.run([sys.executable, "-m", "ckptscope", "convert", str(hf_storage_shards), str(out),
                             "--to", "hf", "--skip-unknown"], capture_output=True, text=True)
    check = subprocess.run([sys.executable, "-m", "ckptscope", "check", str(hf_storage_shards)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # No config.json beside the pieces (torch writes none): one line asking for it, nothing written.
    assert merged.returncode == 2 and "--hf-config" in merged.stderr and not out.exists(), merged.stderr


def test_hf_storage_shards_read_their_config_and_a_missing_rank_file_is_found(hf_storage_shards, tmp_path):
    """The config.json saved beside the pieces (by transformers) is the model's config: read as in an
    HF dir (convert needed --hf-config and called it "not an HF model config"), and the one witness
    of a missing last rank's file, since the pieces then make smaller whole tensors (a probe: check
    said ok). Dropping the first rank's file leaves holes, found without the config."""
    from transformers import LlamaConfig

    from tests.conftest import run_cli

    whole = tmp_path / "whole"
    shutil.copytree(hf_storage_shards, whole)
    LlamaConfig(vocab_size=5, hidden_size=4, intermediate_size=6, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2).save_pretrained(whole)
    data = json.loads(run_cli("inspect", "--json", str(whole)).out)
    assert "config" in {o["name"] for o in data["objects"]}
    assert data["metadata"]["model_type"] == "llama"
    assert {f["path"]: f["role"] for f in data["metadata"]["files"]}["config.json"] == "config"
    whole_check = run_cli("check", str(whole))
    assert whole_check.code == 0, whole_check.out

    last_lost = tmp_path / "last_lost"
    shutil.copytree(whole, last_lost)
    (last_lost / "shard-00002-model-00001-of-00001.safetensors").unlink()
    result = run_cli("check", str(last_lost))
    assert result.code == 1, result.out
    assert "incomplete: config.json" in result.out and "model.embed_tokens.weight is [3, 4]" in result.out
    shown = run_cli("inspect", str(last_lost))
    assert shown.code == 0 and "config.json: the tensors do not fit it" in shown.err, shown.err
    assert "do not fit" not in run_cli("inspect", str(whole)).err

    first_lost = tmp_path / "first_lost"
    shutil.copytree(whole, first_lost)
    (first_lost / "shard-00001-model-00001-of-00001.safetensors").unlink()
    assert run_cli("check", str(first_lost)).code == 1


def test_the_dcp_tutorial_app_state_is_read_under_its_container(tmp_path):
    """PyTorch's DCP recipe saves ``{"app": AppState}`` whose state_dict is ``{"model": ..., "optim": ...}``:
    every key sat under ``app.``, so the model was not found (naming "other") and the optimizer's
    tensors were counted as model parameters. Written here by ``dcp.save`` itself."""
    import torch
    import torch.distributed.checkpoint as dcp

    from tests.conftest import load_sample_module, run_cli

    model = load_sample_module("make_trainer_samples").tiny_model(seed=5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.arange(12).reshape(1, 12), labels=torch.arange(12).reshape(1, 12)).loss.backward()
    optimizer.step()
    dcp.save({"app": {"model": model.state_dict(), "optim": optimizer.state_dict()}}, checkpoint_id=str(tmp_path / "ckpt"))
    data = json.loads(run_cli("inspect", "--json", str(tmp_path / "ckpt")).out)
    roles = data["metadata"]["roles"]
    assert roles["prefix"] == "app.model." and roles["naming"] == "hf" and not roles["unknown"]
    assert data["metadata"]["num_params"] == sum(p.numel() for p in model.parameters())
    assert roles["training_state"]["optimizer"]["tensors"] > 0
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "ref.safetensors"))
    assert run_cli("diff", str(tmp_path / "ckpt"), str(tmp_path / "ref.safetensors")).code == 0


def test_zstd_compressed_items_are_read_not_called_corrupt(tmp_path, cli):
    """``FileSystemWriter(_extensions=[ZStandard()])`` compresses every item (torch's own writer here). diff and
    convert said "corrupt torch zip file" (a probe), and the offset check would have called every item
    misplaced. Check calls the save whole; the items are now decoded (tests/test_dcp_zstd.py): inspect has
    nothing to warn of and a diff of the save with itself compares values."""
    pytest.importorskip("zstandard")
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard

    state = {"model.weight": torch.arange(64, dtype=torch.float32).reshape(8, 8), "model.bias": torch.ones(8)}
    target = tmp_path / "zstd"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(target), _extensions=[ZStandard()]), no_dist=True)
    assert cli("check", str(target)).code == 0
    result = cli("inspect", str(target))
    assert result.code == 0 and "storage transforms" not in result.err, result.err
    result = cli("diff", str(target), str(target))
    assert result.code == 0 and "corrupt" not in result.err, result.err
