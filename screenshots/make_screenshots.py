#!/usr/bin/env python
"""Drive ``ckptscope open`` (and ``ckptscope diff``) headlessly and save an SVG screenshot of each main view.

    python screenshots/make_screenshots.py [--only NAME ...]

Runs from the repository root on the shipped samples (sample_ckpts/), so the images show the
same paths a user types. Each view is a list of key presses, pressed the way a user would;
the script waits for the app's workers (index load, stats, filter) after every key.
Modelled on harlequin's ``scripts/export_screenshots.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "screenshots"
SIZE = (140, 45)

FC1 = "decoder.layers.mlp.linear_fc1.weight"

VIEWS: dict[str, tuple[str, list[str], dict[str, str]]] = {
    # name: (path, keys, options)
    "browse": ("sample_ckpts/hf_llama_sharded", ["down"] * 3 + ["right", "down", "down", "right", "down"], {}),
    "shard_layout": ("sample_ckpts/megatron_torch_dist", ["enter", "slash", *FC1, "enter"], {}),
    "stats": ("sample_ckpts/hf_llama_sharded", ["down", "down", "s"], {}),
    "values": ("sample_ckpts/megatron_style.pt", ["down", "right", "down", "v"], {}),
    # the value pager on a stacked Megatron tensor: layer 1 typed as a slice, a cell under the cursor
    "values_slice": ("sample_ckpts/megatron_torch_dist", ["enter", "slash", *FC1, "enter", "v", "colon", "ctrl+u",
                                                         *"[1, 8:40, :]", "enter", "down", "right"], {}),
    # p on the layers.[0-3] range, two layers typed: the per-tensor comparison of layer 0 and layer 3
    "layers": ("sample_ckpts/hf_llama_sharded", ["down"] * 3 + ["p", *"0 3", "enter"], {}),
    "filter": ("sample_ckpts/hf_llama_sharded", ["slash", *"*_proj.weight"], {}),
    "objects": ("sample_ckpts/megatron_style.pt", ["o"], {}),
    "iterations": ("sample_ckpts/megatron_torch_dist", [], {}),
    "help": ("sample_ckpts/hf_llama_sharded", ["question_mark"], {}),
    "palette": ("sample_ckpts/hf_llama_sharded", ["ctrl+p", *"tensor:"], {}),
    "light": ("sample_ckpts/dtypes.safetensors", ["down", "down", "down", "down", "down", "s"], {"theme": "ckptscope-light"}),
    "error": ("sample_ckpts/make_samples.py", [], {}),
    # r on the layers.[0-3] range, replacement typed so that every layer maps onto one name: the
    # dialog's live preview with the conflicts highlighted
    "rename": ("sample_ckpts/hf_llama_sharded", ["down"] * 3 + ["r", "tab", "ctrl+u", *"model.blocks."], {}),
    # C on a Megatron-Core iteration: the convert form (target hf) with its live plan, the fused qkv
    # row highlighted so the detail line shows the blocks it is cut from
    "convert": ("sample_ckpts/mcore_llama_gqa/iter_0000000", ["C"] + ["tab"] * 4 + ["down"] * 5, {}),
}


TIMELINE_VIEWS = ("timeline",)
"""t in the iteration picker of a tiny run trained for real (make_timeline_samples.py writes it
into a temp dir): the heatmap, the planted flags, the sparkline."""


async def shoot_timeline(name: str) -> Path:
    import tempfile

    from ckptscope.tui.app import make_app
    from ckptscope.tui.screens.timeline import TimelineScreen

    sys.path.insert(0, str(REPO / "sample_ckpts"))
    import make_timeline_samples

    with tempfile.TemporaryDirectory() as tmp:
        make_timeline_samples.write_timeline_hf(Path(tmp))
        os.chdir(tmp)
        try:
            app = make_app("timeline_hf", keymap={})
            async with app.run_test(size=SIZE) as pilot:
                await settle(pilot, 3)
                await pilot.press("t")
                for _ in range(100):
                    await settle(pilot)
                    if isinstance(app.screen, TimelineScreen) and app.screen.result is not None:
                        break
                for key in ("down", "right", "right", "right"):
                    await pilot.press(key)
                await settle(pilot)
                target = OUT / f"{name}.svg"
                app.save_screenshot(filename=target.name, path=str(OUT))
        finally:
            os.chdir(REPO)
    return target


DIFF_VIEWS: dict[str, tuple[str, str, list[str]]] = {
    # name: (A, B, keys), run in a temp dir holding the pair that write_diff_pair() writes:
    # differing tensors only, largest max |a-b| first, so the detail pane shows its heatmap
    "diff": ("llama_base", "llama_tuned", ["d", "3"]),
}


def write_diff_pair(root: Path) -> None:
    """``llama_base`` (a copy of sample_ckpts/hf_llama_single) and ``llama_tuned``: one band of rows
    moved in a layer-1 MLP weight, one spike in a layer-2 q_proj, small noise over a layer-3 o_proj,
    and lm_head saved as float32 (written with safetensors.torch.save_file)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_single", root / "llama_base")
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_single", root / "llama_tuned")
    path = root / "llama_tuned" / "model.safetensors"
    tensors = load_file(str(path))
    g = torch.Generator().manual_seed(0)
    down = tensors["model.layers.1.mlp.down_proj.weight"]
    down[16:24] += (0.1 * torch.randn(down[16:24].shape, generator=g)).to(down.dtype)
    tensors["model.layers.2.self_attn.q_proj.weight"][40, 7] += 0.2
    o_proj = tensors["model.layers.3.self_attn.o_proj.weight"]
    tensors["model.layers.3.self_attn.o_proj.weight"] = o_proj + (1e-3 * torch.randn(o_proj.shape, generator=g)).to(
        o_proj.dtype)
    tensors["lm_head.weight"] = tensors["lm_head.weight"].float()
    save_file(tensors, str(path), metadata={"format": "pt"})


async def shoot_diff(name: str, a: str, b: str, keys: list[str]) -> Path:
    """The diff screen (``ckptscope diff A B``) on the pair ``write_diff_pair`` makes in a temp dir."""
    import tempfile

    from ckptscope.ops.diff.engine import DiffOptions
    from ckptscope.tui.diff_app import make_diff_app

    with tempfile.TemporaryDirectory() as tmp:
        write_diff_pair(Path(tmp))
        os.chdir(tmp)  # the header shows the short names a user would type
        try:
            app = make_diff_app(a, b, options=DiffOptions(device="cpu"), keymap={})
            async with app.run_test(size=SIZE) as pilot:
                for _ in range(50):  # until the engine is done
                    await settle(pilot)
                    if getattr(app.screen, "progress", None) and app.screen.progress.state != "comparing":
                        break
                for key in keys:
                    await pilot.press(key)
                    await settle(pilot, 1)
                await pilot.pause(0.4)  # the detail pane's delay before it computes the heatmap
                await settle(pilot)
                target = OUT / f"{name}.svg"
                app.save_screenshot(filename=target.name, path=str(OUT))
        finally:
            os.chdir(REPO)
    return target


async def settle(pilot, rounds: int = 2) -> None:
    for _ in range(rounds):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


async def shoot(name: str, path: str, keys: list[str], options: dict[str, str]) -> Path:
    from ckptscope.tui.app import make_app

    app = make_app(path, keymap={}, theme=options.get("theme"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, 3)
        for key in keys:
            await pilot.press(key)
            if key in ("enter", "ctrl+p"):
                await pilot.pause(0.3)
            await settle(pilot, 1)
        await pilot.pause(0.4)  # the filter's typing delay, palette search
        await settle(pilot)
        target = OUT / f"{name}.svg"
        app.save_screenshot(filename=target.name, path=str(OUT))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted([*VIEWS, *DIFF_VIEWS, *TIMELINE_VIEWS]))
    args = parser.parse_args(argv)
    os.chdir(REPO)
    for name in args.only or [*VIEWS, *DIFF_VIEWS, *TIMELINE_VIEWS]:
        if name in TIMELINE_VIEWS:
            target = asyncio.run(shoot_timeline(name))
            print(f"wrote {target.relative_to(REPO)}", file=sys.stderr)
            continue
        if name in DIFF_VIEWS:
            target = asyncio.run(shoot_diff(name, *DIFF_VIEWS[name]))
            print(f"wrote {target.relative_to(REPO)}", file=sys.stderr)
            continue
        path, keys, options = VIEWS[name]
        target = asyncio.run(shoot(name, path, keys, options))
        print(f"wrote {target.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
