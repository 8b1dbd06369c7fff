"""Row 9: ``ckptscope open`` on 20,000 tensors, seconds from process start to a usable tree.

Not a ratio (no other tool draws this tree): the median of N fresh processes, with [min-max].
Each run starts a new interpreter, so its start-up and imports count as they do for a user: the
clock starts in this process just before the spawn and stops at the child's ``time.monotonic()``
(one clock for every process on Linux). The figure without the interpreter's start-up (from the
child's first line) is kept in the JSON as ``after_start_up``. The app runs headless
(``run_test``); *usable tree* is when the tree is first drawn with its rows (the index worker has
finished, the tree is populated and the compositor asks it for lines; keys go to it from then on).
*First frame* (the loading indicator painted) is kept in the JSON. The probe loads what
``ckptscope open`` loads, in its order: the process entry's ``load`` (the CLI and the ``open``
command, collector paused), then ``make_app`` (Textual and the screens); only the last step,
``App.run`` in a terminal, is ``run_test`` here.
"""

from __future__ import annotations

import json
import statistics
import time

from abab import PY, BenchError, Config, Row, spawn, warm

PROBE = r"""
import asyncio, json, sys, time
t0 = time.monotonic()
from ckptscope.__main__ import load
load(["open", sys.argv[1]])  # what `ckptscope open` loads before the app (click, the command table)
from ckptscope.tui import make_app
app = make_app(sys.argv[1], keymap={})  # what `open` does next (run_tui): loads Textual and the screens
from ckptscope.tui.widgets.tensor_tree import TensorTree  # loaded by make_app: patched before the app runs

painted = []
_render_lines = TensorTree.render_lines
def render_lines(self, crop):
    if not painted and self.root.children and not self.loading:
        painted.append(time.monotonic())
    return _render_lines(self, crop)
TensorTree.render_lines = render_lines

async def main():
    async with app.run_test(size=(140, 45)):
        first = time.monotonic()
        while not painted:
            await asyncio.sleep(0.005)
        print(json.dumps({"child_start": t0, "first_frame": first, "usable_tree": painted[0],
                          "tensors": len(app.screen.index)}))

asyncio.run(main())
"""


def row9(cfg: Config) -> list[Row]:
    path, _ = cfg.data("single_20000", "many_tensors", tensors=20_000, shards=1)
    file = path / "model.safetensors"
    warm(file)

    def once() -> dict:
        start = time.monotonic()
        run = spawn([PY, "-c", PROBE, str(file)], capture=True)
        if run.code:
            raise BenchError(f"TUI probe failed:\n{run.stderr[-1500:]}")
        got = json.loads(run.stdout.strip().splitlines()[-1])
        return {"usable_tree": got["usable_tree"] - start, "first_frame": got["first_frame"] - start,
                "after_start_up": got["usable_tree"] - got["child_start"], "tensors": got["tensors"]}

    once()  # warm-up, untimed
    runs = [once() for _ in range(cfg.pairs)]
    if runs[0]["tensors"] != 20_000:
        raise BenchError(f"TUI shows {runs[0]['tensors']} tensors, expected 20000")
    first = statistics.median(r["first_frame"] for r in runs)
    later = statistics.median(r["after_start_up"] for r in runs)
    return [Row("9", "TUI `open`, 20,000 tensors: process start -> usable tree (absolute, median of fresh runs)",
                kind="seconds", target=0.5, values=[round(r["usable_tree"], 4) for r in runs], raw=runs,
                note=f"not a ratio; first frame median {first:.2f} s; without the interpreter's start-up {later:.2f} s")]

