"""The value pager's slices: parsed as NumPy parses them, and read_page returns exactly the values
NumPy slicing gives on the tensor loaded by safetensors / torch (independent of our reader)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ckptscope.core.errors import CkptError
from ckptscope.formats.registry import open_checkpoint
from ckptscope.ops.values import exact_float, page_axes, parse_selection, read_page, stored_bits

HF = Path(__file__).parent.parent / "sample_ckpts" / "hf_llama_single"
DIST = Path(__file__).parent.parent / "sample_ckpts" / "megatron_torch_dist" / "iter_0000010"


@pytest.mark.parametrize("text", ["[3:5, 10:14]", "3, :", "[-1]", "[:, -4:]", "[..., 7]", "[1:2, 60:]", ""])
def test_read_page_equals_numpy_slicing(text):
    ref = load_file(HF / "model.safetensors")["model.embed_tokens.weight"].float().numpy()
    with open_checkpoint(HF) as reader:
        sel = parse_selection(text, tuple(ref.shape))
        page = read_page(reader, "model.embed_tokens.weight", sel, rows=1000, cols=1000)
    expected = eval(f"ref[{text.strip('[]') or ':'}]")  # NumPy's own reading of the same text
    np.testing.assert_array_equal(page.values.astype(np.float32).reshape(expected.shape), expected)


def test_page_offsets_and_bounds():
    ref = load_file(HF / "model.safetensors")["model.embed_tokens.weight"].float().numpy()
    with open_checkpoint(HF) as reader:
        sel = parse_selection("[10:200, 5:60]", tuple(ref.shape))
        page = read_page(reader, "model.embed_tokens.weight", sel, row=20, col=16, rows=8, cols=4)
        assert page.values.shape == (8, 4)
        np.testing.assert_array_equal(page.values.astype(np.float32), ref[30:38, 21:25])
        assert page.index_of(2, 3) == (32, 24)
        last = read_page(reader, "model.embed_tokens.weight", sel, row=10_000, rows=8, cols=4)
        assert last.row_start == 199 and last.values.shape == (1, 4)  # clamped to the last row


def test_stacked_layer_step_reads_each_layer():
    """A Megatron stacked tensor [L, out, in]: index 0 is layer 0, stepping goes to layer 1."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    name = "decoder.layers.mlp.linear_fc1.weight"
    meta = FileSystemReader(str(DIST)).read_metadata()
    assert isinstance(meta.state_dict_metadata[name], TensorStorageMetadata)
    import torch.distributed.checkpoint as dcp

    state = {name: torch.empty(tuple(meta.state_dict_metadata[name].size), dtype=torch.bfloat16)}
    dcp.load(state, storage_reader=FileSystemReader(str(DIST)), no_dist=True)
    ref = state[name].float().numpy()
    with open_checkpoint(DIST) as reader:
        sel = parse_selection("[0, 5:9, :]", tuple(ref.shape))
        assert page_axes(sel) == (1, 2, ())
        np.testing.assert_array_equal(read_page(reader, name, sel, cols=64).values.astype(np.float32), ref[0, 5:9])
        nxt = sel.stepped(1)
        assert nxt.text() == "[1, 5:9, :]" and nxt.stepped(5).text() == "[1, 5:9, :]"  # clamped at the last
        np.testing.assert_array_equal(read_page(reader, name, nxt, cols=64).values.astype(np.float32), ref[1, 5:9])
        whole = parse_selection("", tuple(ref.shape))  # 3 free axes: the first is held, [ ] step it
        assert page_axes(whole) == (1, 2, (0,)) and whole.stepped(1).text() == "[1, :, :]"
        assert "held at its first index" in read_page(reader, name, whole, rows=4, cols=4).title()
        page = read_page(reader, name, whole.stepped(1), rows=4, cols=4)
        np.testing.assert_array_equal(page.values.astype(np.float32), ref[1, :4, :4])
        assert "held" not in page.title() and whole.can_step and not parse_selection("", ref.shape[1:]).can_step


def test_exact_display_of_stored_bits():
    value = torch.tensor([1.0, -0.1], dtype=torch.bfloat16)
    with open_checkpoint(HF) as reader:
        page = read_page(reader, "model.embed_tokens.weight", parse_selection("[0, 0:2]", (256, 64)))
    raw = load_file(HF / "model.safetensors")["model.embed_tokens.weight"][0, :2]
    for i in range(2):
        bits = int(raw[i].view(torch.int16).item()) & 0xFFFF
        assert stored_bits(page.values[0, i]) == f"0x{bits:04x}"
        assert float(exact_float(page.values[0, i])) == raw[i].item()
    import ml_dtypes

    b = np.array(value.float().numpy(), dtype=ml_dtypes.bfloat16)
    assert stored_bits(b[0]) == "0x3f80" and exact_float(b[1]) == repr(float(value[1].item()))
    f8 = np.array([0.5], dtype=ml_dtypes.float8_e4m3fn)
    assert stored_bits(f8[0]) == "0x30" and exact_float(f8[0]) == "0.5"


@pytest.mark.parametrize("text, message", [
    ("[0:10:2]", "steps are not supported"), ("[300]", "out of range"), ("[1, 2, 3]", "3 indices"),
    ("[5:5]", "selects nothing"), ("[a]", "neither an index nor a slice"), ("[..., ...]", "only one ..."),
])
def test_bad_slices_say_why(text, message):
    with pytest.raises(CkptError, match=message):
        parse_selection(text, (256, 64))
