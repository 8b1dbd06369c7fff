#!/usr/bin/env python
"""Startup of ``ckptscope open`` on a 20,000-tensor checkpoint: time to first frame and to a
usable tree, against baselines measured in the same run.

    python bench/bench_tui_startup.py [--tensors 20000] [--repeat 3]

The checkpoint is written with the real safetensors writer into a temp dir: an MoE-shaped model
(layers of 128 experts x 3 + 20 other tensors, cut at 20,000 tensors) whose experts differ in
shape so ranges cannot hide them. Every measurement runs in a fresh Python process so import
costs count as they do for a user:

* ``index``: ``open_checkpoint(path).index()`` + ``build_tree`` (the raw work, no UI);
* ``inspect --json``: the CLI doing the same and printing it;
* TUI (headless ``run_test``): *first frame* is when the app is mounted and has painted
  (the loading indicator is on screen); *usable tree* is when the tree is first drawn with its
  rows (the index worker has finished, the tree is populated, the compositor asks it for
  lines; keys go to it from then on); *detail panes* is when the right-hand tabs, mounted after
  the tree, are filled and painted; then 20 cursor moves and one expand of a 128-expert node
  are timed to show it stays responsive.

Target: usable tree in < 1 s. The package is byte-compiled first (``compileall``), as an
installed package is; this machine's environment sets PYTHONDONTWRITEBYTECODE, which would
otherwise make every run compile ckptscope's modules from source.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TUI_PROBE = r"""
import asyncio, json, sys, time
t0 = time.perf_counter()
import ckptscope.cli  # what `ckptscope open` imports before the app (click, the command table)
from ckptscope.tui import make_app
from ckptscope.tui.widgets.tensor_tree import TensorTree

painted = []  # when the tree is first drawn with its rows (the compositor asks it for lines)
_render_lines = TensorTree.render_lines
def render_lines(self, crop):
    if not painted and self.root.children and not self.loading:
        painted.append(time.perf_counter() - t0)
    return _render_lines(self, crop)
TensorTree.render_lines = render_lines

async def main():
    app = make_app(sys.argv[1], keymap={})
    async with app.run_test(size=(140, 45)) as pilot:
        first = time.perf_counter() - t0
        screen = app.screen
        tree = screen.query_one(TensorTree)
        while not painted:
            await asyncio.sleep(0.005)
        usable = painted[0]
        while not screen.panes_ready:
            await asyncio.sleep(0.005)
        await pilot.pause()
        panes = time.perf_counter() - t0
        t = time.perf_counter()
        for _ in range(20):
            await pilot.press("down")
        moves = (time.perf_counter() - t) / 20
        # open model.layers.0.mlp, then time expanding "experts" (128 children, built on demand)
        chain, node = [], screen.module_tree
        while node.path != "model.layers.0.mlp.experts":
            node = next(t for _, t in node.folded_children()
                        if "model.layers.0.mlp.experts".startswith(t.path + ".") or t.path == "model.layers.0.mlp.experts")
            chain.append(node)
        tree.reveal(chain)
        await pilot.pause()
        t = time.perf_counter()
        await pilot.press("right")
        await pilot.pause()
        expand = time.perf_counter() - t
        print(json.dumps({"first_frame": first, "usable_tree": usable, "panes": panes, "move": moves, "expand": expand,
                          "tensors": len(screen.index), "widget_nodes": len(tree._by_node)}))

asyncio.run(main())
"""

INDEX_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
from ckptscope.formats import open_checkpoint
from ckptscope.ops.tree import build_tree
index = open_checkpoint(sys.argv[1]).index()
build_tree(index.tensors.values())
print(json.dumps({"index": time.perf_counter() - t0}))
"""


def write_checkpoint(folder: Path, tensors: int) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    data = {}
    layer = 0
    while len(data) < tensors:
        prefix = f"model.layers.{layer}"
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            data[f"{prefix}.{name}"] = np.ones((8,), dtype=np.float16)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            for part in ("weight", "bias", "lora_A", "lora_B"):
                data[f"{prefix}.self_attn.{proj}.{part}"] = np.zeros((4, 4), dtype=np.float16)
        data[f"{prefix}.mlp.gate.weight"] = np.zeros((128, 8), dtype=np.float16)
        data[f"{prefix}.mlp.shared.weight"] = np.zeros((8, 8), dtype=np.float16)
        for expert in range(128):
            for w in ("gate_proj", "up_proj", "down_proj"):
                # expert sizes vary (as after pruning) so layers and experts do not collapse
                shape = (2 + (expert + layer) % 3, 4)
                data[f"{prefix}.mlp.experts.{expert}.{w}.weight"] = np.zeros(shape, dtype=np.float16)
        layer += 1
    names = list(data)[:tensors]
    path = folder / "model.safetensors"
    save_file({n: data[n] for n in names}, str(path))
    return path


def run(code: str | None, args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "ckptscope", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    # Byte-compile ckptscope first, as `pip install` does and as any normal first run leaves behind:
    # this box sets PYTHONDONTWRITEBYTECODE, so otherwise every run would compile ~60 modules anew.
    import compileall

    import ckptscope

    compileall.compile_dir(str(Path(ckptscope.__file__).parent), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp), args.tensors)
        size = path.stat().st_size / 2**20
        print(f"checkpoint: {args.tensors:,} tensors, {size:.1f} MiB, written by safetensors", file=sys.stderr)
        index_t, inspect_t, tui = [], [], []
        for _ in range(args.repeat):  # interleaved, so machine load hits every variant alike
            index_t.append(json.loads(run(INDEX_PROBE, [str(path)])[1])["index"])
            inspect_t.append(run(None, ["inspect", "--json", str(path)])[0])
            tui.append(json.loads(run(TUI_PROBE, [str(path)])[1]))
    med = statistics.median
    first, usable = med(r["first_frame"] for r in tui), med(r["usable_tree"] for r in tui)
    print(f"median of {args.repeat} runs, {tui[0]['tensors']:,} tensors, "
          f"{tui[0]['widget_nodes']} tree widget nodes built at start")
    for label, seconds in (("baseline: index + build_tree (in process)", med(index_t)),
                           ("baseline: ckptscope inspect --json (wall)", med(inspect_t)),
                           ("TUI: first frame (loading indicator shown)", first),
                           ("TUI: usable tree (drawn with its rows)", usable),
                           ("TUI: detail panes filled and painted", med(r["panes"] for r in tui)),
                           ("TUI: one cursor move (pilot round trip)", med(r["move"] for r in tui)),
                           ("TUI: expand a 128-expert node", med(r["expand"] for r in tui))):
        print(f"  {label:<50} {seconds * 1000:8.1f} ms")
    print(f"  usable tree / inspect --json: {usable / med(inspect_t):.2f}x;  usable tree - first frame: "
          f"{(usable - first) * 1000:.0f} ms;  target < 1000 ms: {'met' if usable < 1.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
