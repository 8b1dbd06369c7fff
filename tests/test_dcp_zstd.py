"""DCP saves whose items torch compressed (``FileSystemWriter(_extensions=[ZStandard()])``) read as torch
loads them. Before: listed, and every read refused ("does not decode").

The saves are written by torch's own writer with its own ZStandard extension; the judge is torch's
``dcp.load`` and, for the export, transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, run_cli

pytest.importorskip("zstandard")
import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.checkpoint import FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint._extension import ZStandard  # noqa: E402

from ckptscope.core.errors import CkptError  # noqa: E402
from ckptscope.formats import open_checkpoint  # noqa: E402

HF = REPO / "sample_ckpts" / "hf_llama_gqa"


def _state() -> dict[str, torch.Tensor]:
    state = load_file(str(HF / "model.safetensors"))
    state["extra.bf16"] = torch.arange(40, dtype=torch.float32).reshape(5, 8).to(torch.bfloat16)
    state["extra.view"] = torch.arange(64, dtype=torch.int64).reshape(8, 8)[:, 2:5]  # not contiguous
    return state


@pytest.fixture(scope="module")
def compressed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zstd") / "dcp"
    dcp.save(_state(), storage_writer=FileSystemWriter(str(out), _extensions=[ZStandard()]), no_dist=True)
    return out


def _torch_loaded(path: Path) -> dict[str, torch.Tensor]:
    state = {k: torch.zeros_like(v.contiguous()) for k, v in _state().items()}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def test_every_tensor_reads_as_torch_loads_it(compressed):
    expected = _torch_loaded(compressed)
    with open_checkpoint(compressed) as reader:
        index = reader.index()
        assert not index.warnings, index.warnings  # nothing left unreadable
        for name, tensor in expected.items():
            want = tensor.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()
            got = reader.read(name)
            got = got.view(np.int16) if tensor.dtype == torch.bfloat16 else got
            assert np.array_equal(got, want), name
        rows = reader.read("model.embed_tokens.weight", (slice(3, 7),))  # a region of one compressed item
        assert np.array_equal(rows, expected["model.embed_tokens.weight"][3:7].numpy())


def test_diff_and_export_through_the_compressed_items(compressed, tmp_path):
    from transformers import AutoModelForCausalLM

    assert run_cli("diff", str(HF), str(compressed), "--exclude", "extra.*").code == 0
    assert run_cli("diff", str(compressed), str(compressed)).code == 0  # both sides decoded, values compared
    out = tmp_path / "hf"
    only_model = tmp_path / "model_only"
    dcp.save(load_file(str(HF / "model.safetensors")),
             storage_writer=FileSystemWriter(str(only_model), _extensions=[ZStandard()]), no_dist=True)
    result = run_cli("convert", str(only_model), str(out), "--to", "hf", "--hf-config", str(HF))
    assert result.code == 0, result.err
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    reference = load_file(str(HF / "model.safetensors"))
    for name, tensor in model.state_dict().items():
        if name in reference:
            assert torch.equal(tensor, reference[name]), name


def test_a_damaged_stream_is_one_line(compressed, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(compressed, damaged)
    data = damaged / "__0_0.distcp"
    blob = bytearray(data.read_bytes())
    with open_checkpoint(compressed) as reader:
        chunk = reader.index().tensors["model.norm.weight"].chunks[0]
    for at in range(chunk.byte_offset + 4, chunk.byte_offset + chunk.byte_length - 4):
        blob[at] ^= 0x5A
    data.write_bytes(bytes(blob))
    with open_checkpoint(damaged) as reader, pytest.raises(CkptError, match="model.norm.weight"):
        reader.read("model.norm.weight")
    result = run_cli("diff", str(HF), str(damaged), "--exclude", "extra.*")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err, \
        result.err


def test_without_the_zstandard_package_it_says_what_to_install(compressed, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails as on a machine without it
    with open_checkpoint(compressed) as reader, pytest.raises(CkptError, match=r"pip install 'ckptscope\[zstd\]'"):
        reader.read("model.norm.weight")


def test_inspect_json_lists_the_transform(compressed):
    result = run_cli("inspect", "--json", str(compressed))
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["metadata"]["warnings"] == []


def test_objects_are_decoded_too(tmp_path):
    """Non-tensor entries (torch.save'd bytes items) go through the same extension: their values show."""
    out = tmp_path / "objects"
    dcp.save({"w": torch.ones(3), "step": 7, "extra": {"lr": 0.1, "name": "adamw"}},
             storage_writer=FileSystemWriter(str(out), _extensions=[ZStandard()]), no_dist=True)
    with open_checkpoint(out) as reader:
        objects = {o.name: o.value for o in reader.index().objects}
    assert objects == {"step": 7, "extra.lr": 0.1, "extra.name": "adamw"}


def test_a_stream_that_inflates_past_its_chunk_is_refused_without_inflating_it():
    """A few KB that inflate to 200 MB (a damaged or hostile item) stop at the chunk's bound."""
    import zstandard

    from ckptscope.formats.dcp.transforms import ZSTD, decode_item

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (200 << 20))
    assert len(bomb) < 100_000
    with pytest.raises(CkptError, match="inflates to more than the 1,048,576 bytes"):
        decode_item(bomb, ZSTD, 1 << 20, "w", Path("x.distcp"))
    with pytest.raises(CkptError, match="does not decode"):
        decode_item(bomb, "stream.zstd/1, other/1", 1 << 20, "w", Path("x.distcp"))
