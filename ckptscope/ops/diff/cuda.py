"""The CUDA side of ``ckptscope diff --device cuda``: same metrics as metrics.compare_block,
reduced on the GPU.

Each diff worker thread owns a pinned staging buffer pair and a copy stream: a block read from disk
is copied into pinned memory, sent host-to-device on the copy stream, and reduced on the compute
stream once the copy's event fires. With several workers, one thread's disk read overlaps another's
transfer and a third's reduction. Only sums (float64), counts and the argmax come back to the host,
so the result merges with CPU blocks and reports identically (diff.py rounds the float metrics).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ckptscope.ops.diff.metrics import Accumulator

_INT_BY_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_TORCH_NAME = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
               "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz"}


class CudaComparer:
    def __init__(self, block_bytes: int) -> None:
        import torch

        self.torch = torch
        self.block_bytes = block_bytes
        self._local = threading.local()

    def _context(self, nbytes: int):
        torch = self.torch
        ctx = getattr(self._local, "ctx", None)
        if ctx is None or ctx["pinned"][0].numel() < nbytes:
            size = max(nbytes, self.block_bytes)
            ctx = self._local.ctx = {
                "pinned": (torch.empty(size, dtype=torch.uint8, pin_memory=True),
                           torch.empty(size, dtype=torch.uint8, pin_memory=True)),
                "copy": torch.cuda.Stream(),
            }
        return ctx

    def _to_device(self, array: np.ndarray, pinned, stream):
        torch = self.torch
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        host = pinned[: raw.size]
        host.numpy()[:] = raw
        with torch.cuda.stream(stream):
            device = host.to("cuda", non_blocking=True)
        name = _TORCH_NAME.get(array.dtype.name, array.dtype.name)
        return device, getattr(torch, name)

    def compare(self, a: np.ndarray, b: np.ndarray, origin: tuple[int, ...], *, atol: float = 0.0,
                rtol: float = 0.0) -> Accumulator:
        torch = self.torch
        acc = Accumulator(numel=int(a.size))
        if a.size == 0:
            return acc
        ctx = self._context(max(a.nbytes, b.nbytes))
        copy = ctx["copy"]
        raw_a, dtype_a = self._to_device(a, ctx["pinned"][0], copy)
        raw_b, dtype_b = self._to_device(b, ctx["pinned"][1], copy)
        done = torch.cuda.Event()
        done.record(copy)
        torch.cuda.current_stream().wait_event(done)
        ga = raw_a.view(dtype_a).reshape(-1)
        gb = raw_b.view(dtype_b).reshape(-1)
        a64, b64 = ga.to(torch.float64), gb.to(torch.float64)
        same = a.dtype == b.dtype and a.dtype.itemsize in _INT_BY_SIZE and a.dtype.kind != "c"
        if same:
            kind = getattr(torch, _INT_BY_SIZE[a.dtype.itemsize])
            differ = raw_a.view(kind) != raw_b.view(kind)
        else:
            differ = ~((a64 == b64) | (torch.isnan(a64) & torch.isnan(b64)))
        total = float((a64 @ a64).item()) if same else math.nan
        if same and math.isfinite(total):
            # The CPU's shortcut, reproduced: b equals a outside ``differ``.
            where = torch.nonzero(differ).reshape(-1)
            da, db = a64[where], b64[where]
            finite = torch.isfinite(db)
            fa, fb = torch.where(finite, da, 0.0), torch.where(finite, db, 0.0)
            drop_v = torch.where(finite, 0.0, da)
            parts = torch.stack([drop_v @ drop_v, fb @ fb - fa @ fa, fa @ (fb - fa)]).cpu().tolist()
            acc.sum_sq_a = total - parts[0]
            acc.sum_sq_b = total - parts[0] + parts[1]
            acc.dot = total - parts[0] + parts[2]
            acc.num_diff = int(where.numel())
        else:
            finite = torch.isfinite(a64) & torch.isfinite(b64)
            fa, fb = torch.where(finite, a64, 0.0), torch.where(finite, b64, 0.0)
            sums = torch.stack([fa @ fa, fb @ fb, fa @ fb, differ.sum().to(torch.float64)]).cpu().tolist()
            acc.sum_sq_a, acc.sum_sq_b, acc.dot = sums[0], sums[1], sums[2]
            acc.num_diff = int(sums[3])
        if acc.num_diff == 0:
            return acc
        where = torch.nonzero(differ).reshape(-1)
        da, db = a64[where], b64[where]
        delta = (da - db).abs()
        delta = torch.where(torch.isnan(da) & torch.isnan(db), 0.0, delta)
        nan_delta = torch.isnan(delta)
        delta_ok = torch.where(nan_delta, 0.0, delta)
        top = torch.argmax(delta_ok)
        allowed = atol + rtol * db.abs()
        stats = torch.stack([delta_ok.sum(), delta_ok @ delta_ok, delta_ok[top], nan_delta.any().to(torch.float64),
                             (~(delta <= allowed)).sum().to(torch.float64),
                             where[top].to(torch.float64)]).cpu().tolist()
        acc.sum_abs, acc.sum_sq_diff, acc.max_abs = stats[0], stats[1], stats[2]
        acc.nan = bool(stats[3])
        acc.violations = int(stats[4])
        local = np.unravel_index(int(stats[5]), a.shape)
        acc.max_at = tuple(int(o + i) for o, i in zip(origin, local))
        return acc
