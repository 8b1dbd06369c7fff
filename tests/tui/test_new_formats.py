"""Each format added this round opens in the TUI as a person opens it, on a file written by the real
writer: the header names the format, the tree shows the model, and the value pager's first page
equals the values read by that format's own library (DeepSpeed's oracle, PEFT's safetensors, gguf-py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from textual.widgets import DataTable
from tui_helpers import settle, sync

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.widgets.summary_header import SummaryHeader

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_ckpts"


def generator(name: str):
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module(name)


def pager_values(app) -> np.ndarray:
    table = app.screen.query_one("#values-table", DataTable)
    return np.array([[float(table.get_cell_at((r, c)).plain) for c in range(1, len(table.columns))]
                     for r in range(table.row_count)])


async def open_and_page(path: Path, name: str) -> tuple[str, np.ndarray]:
    app = make_app(str(path), keymap={})
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)
        index = screen.query_one(SummaryHeader).index
        assert index is not None
        meta = screen.reader.meta(name)
        screen.current = meta
        await pilot.press("v")
        await settle(pilot)
        return index.format, pager_values(app)


def first_page(ref: np.ndarray, shown: np.ndarray) -> np.ndarray:
    ref = ref.reshape(1, -1) if ref.ndim == 1 else ref
    return ref[: shown.shape[0], : shown.shape[1]]


@sync
async def test_deepspeed_zero3_pages_deepspeeds_own_fp32(tmp_path):
    name = "model.layers.1.self_attn.v_proj.weight"
    oracle = torch.load(SAMPLES / "deepspeed_zero" / "zero3.fp32_oracle.pt", weights_only=True)
    fmt, shown = await open_and_page(SAMPLES / "deepspeed_zero" / "zero3" / "global_step2", name)
    assert fmt == "deepspeed"
    np.testing.assert_allclose(shown, first_page(oracle[name].numpy(), shown), rtol=1e-3, atol=1e-6)


@sync
async def test_peft_adapter_pages_its_lora_b(tmp_path):
    from safetensors.torch import load_file

    adapter = generator("make_peft_samples").write_lora(tmp_path)
    stored = load_file(adapter / "adapter_model.safetensors")
    name = next(n for n in sorted(stored) if "lora_A" in n)
    fmt, shown = await open_and_page(adapter, name)
    assert fmt == "peft"
    np.testing.assert_allclose(shown, first_page(stored[name].float().numpy(), shown), rtol=1e-3, atol=1e-6)


@sync
async def test_gguf_q8_0_pages_ggufs_own_dequantisation(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = generator("make_gguf_samples").write_tiny_llama(tmp_path)
    reader = gguf.GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.tensor_type.name == "Q8_0")
    ref = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    fmt, shown = await open_and_page(path, tensor.name)
    assert fmt == "gguf"
    np.testing.assert_allclose(shown, first_page(ref, shown), rtol=1e-3, atol=1e-6)
