#!/usr/bin/env python
"""Drive ``ckptscope open`` headlessly and save an SVG screenshot of each main view.

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
    "filter": ("sample_ckpts/hf_llama_sharded", ["slash", *"*_proj.weight"], {}),
    "objects": ("sample_ckpts/megatron_style.pt", ["o"], {}),
    "iterations": ("sample_ckpts/megatron_torch_dist", [], {}),
    "help": ("sample_ckpts/hf_llama_sharded", ["question_mark"], {}),
    "palette": ("sample_ckpts/hf_llama_sharded", ["ctrl+p", *"tensor:"], {}),
    "light": ("sample_ckpts/dtypes.safetensors", ["down", "down", "down", "down", "down", "s"], {"theme": "ckptscope-light"}),
    "error": ("sample_ckpts/make_samples.py", [], {}),
}


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
    parser.add_argument("--only", nargs="*", choices=sorted(VIEWS))
    args = parser.parse_args(argv)
    os.chdir(REPO)
    for name in args.only or VIEWS:
        path, keys, options = VIEWS[name]
        target = asyncio.run(shoot(name, path, keys, options))
        print(f"wrote {target.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
