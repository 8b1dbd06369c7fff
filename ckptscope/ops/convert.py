"""Run a ``ConvertPlan``: stream tensor by tensor into a temporary directory, rename into place.

Each destination tensor is assembled from its recipe's source regions (block copies only), cast if
``--dtype`` asked for it, written, and dropped before the next one: peak memory is about one
destination tensor plus the regions being read, whatever the model size.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.formats.filecopy import copy_range
from ckptscope.mappings.links import materialize
from ckptscope.ops.atomic import atomic_output, check_destination
from ckptscope.ops.convert_plan import ConvertPlan, OutputTensor

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

Progress = Callable[[str, int], None]
"""``progress(tensor_name, nbytes_written)``."""


def produce(plan: ConvertPlan, tensor: OutputTensor):
    """The destination tensor as a numpy array (assembled, cast when asked)."""
    reader = plan.reader
    array = materialize(tensor.recipe, lambda source, slices: reader.read(source, slices),
                        dtype=dtype_by_name(tensor.recipe.dtype).numpy())
    reader.release_pages()  # the source pages are copied out: drop them before the writer serialises
    if tensor.dtype != tensor.recipe.dtype:
        array = array.astype(dtype_by_name(tensor.dtype).numpy())
    return array


class Prefetcher:
    """Hands out destination tensors in plan order, producing the next one on a second thread
    while the caller writes this one.

    Reading (page faults on the source maps, block copies, fused assembly) and writing (the
    ``write`` syscalls) then overlap: numpy's copies and file writes release the GIL. At most
    two destination tensors are alive at once (the one being written and the next), which is
    what the memory bound (2 x the largest tensor + 300 MB) allows. A tensor asked for out of
    order is produced directly, so a writer that revisits tensors stays correct.
    """

    def __init__(self, plan: ConvertPlan, order: list[OutputTensor]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._plan = plan
        self._order = order
        self._position = {t.name: i for i, t in enumerate(order)}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptscope-produce")
        self._pending: tuple[str, Future] | None = None

    def get(self, tensor: OutputTensor) -> np.ndarray:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == tensor.name:
            array = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
            array = produce(self._plan, tensor)
        following = self._position.get(tensor.name, len(self._order)) + 1
        if following < len(self._order):
            after = self._order[following]
            self._pending = (after.name, self._pool.submit(produce, self._plan, after))
        return array

    def close(self) -> None:
        """Stop: wait for a tensor being produced (it may hold the reader), drop it."""
        self._pending = None
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher:  # noqa: PYI034 -- a final class; typing.Self needs 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_runs(plan: ConvertPlan, tensor: OutputTensor) -> list[tuple[Path, int, int]] | None:
    """The destination tensor as source file byte runs to concatenate, when it is one: no cast,
    no zero fill, and pieces that tile it along its first axis in order, each a contiguous run
    of its source (a renamed tensor, one layer of a stacked one, q/k/v or gate/up rows of a fused
    one). Such tensors are copied file to file by the kernel, as ``cp`` does; None otherwise."""
    from ckptscope.mappings.links import source_slices

    recipe = tensor.recipe
    if tensor.dtype != recipe.dtype or recipe.fill or not recipe.pieces or not recipe.shape:
        return None
    pieces = sorted(recipe.pieces, key=lambda p: p.dst_box[0][0])
    row = 0
    for piece in pieces:
        first, rest = piece.dst_box[0], piece.dst_box[1:]
        if first[0] != row or any(box != (0, n) for box, n in zip(rest, recipe.shape[1:])):
            return None
        row = first[1]
    if row != recipe.shape[0]:
        return None
    runs = []
    for piece in pieces:
        span = plan.reader.byte_span(piece.source, source_slices(piece, piece.dst_box))
        if span is None:
            return None
        runs.append(span)
    return runs


def _safetensors_header(tensors: list[OutputTensor]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        code = dtype_by_name(t.dtype).safetensors
        if code is None:
            raise CkptError(f"{t.name}: dtype {t.dtype} cannot be stored in safetensors")
        header[t.name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def write_hf(plan: ConvertPlan, out: Path, progress: Progress | None = None) -> None:
    by_name = {t.name: t for t in plan.tensors}
    weight_map: dict[str, str] = {}
    runs = {t.name: file_runs(plan, t) for t in plan.tensors}
    order = [by_name[n] for _, names in plan.shards for n in names if runs[n] is None]
    with Prefetcher(plan, order) as tensors_in_order:
        for filename, names in plan.shards:
            tensors = [by_name[n] for n in names]
            with open(out / filename, "wb") as handle:
                handle.write(_safetensors_header(tensors))
                for t in tensors:
                    spans = runs[t.name]
                    if spans is not None:
                        for path, offset, length in spans:
                            copy_range(path, handle, offset, length)
                        weight_map[t.name] = filename
                        if progress:
                            progress(t.name, t.nbytes)
                        continue
                    array = tensors_in_order.get(t)
                    if array.shape != t.shape:
                        raise CkptError(f"{t.name}: assembled shape {array.shape} is not the planned {t.shape}")
                    handle.write(memoryview(array.reshape(-1).view("uint8")) if array.size else b"")
                    del array
                    weight_map[t.name] = filename
                    if progress:
                        progress(t.name, t.nbytes)
    if len(plan.shards) > 1:
        index = {"metadata": {"total_size": plan.total_bytes}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = dict(plan.hf_config or {})
    dtypes = {t.dtype for t in plan.tensors if t.dtype.startswith(("float", "bfloat"))}
    if len(dtypes) == 1:
        config["torch_dtype"] = dtypes.pop()
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for source, name in plan.copies:
        if not (out / name).exists():
            shutil.copy2(source, out / name)


def write_mcore(plan: ConvertPlan, out: Path, progress: Progress | None = None) -> None:
    from ckptscope.formats.megatron_write import OutTensor

    iter_dir = out / f"iter_{plan.iteration:07d}"
    iter_dir.mkdir()
    if plan.ckpt_format == "torch":  # per-rank files revisit each tensor: no read-ahead
        tensors = [OutTensor(t.name, t.shape, t.dtype, (lambda t=t: produce(plan, t))) for t in plan.tensors]
        _write_mcore(plan, out, iter_dir, tensors, progress)
        return
    runs = {t.name: file_runs(plan, t) for t in plan.tensors}
    order = [t for t in plan.tensors if runs[t.name] is None]
    with Prefetcher(plan, order) as ahead:
        tensors = [OutTensor(t.name, t.shape, t.dtype, (lambda t=t: ahead.get(t)), (lambda t=t: runs[t.name]))
                   for t in plan.tensors]
        _write_mcore(plan, out, iter_dir, tensors, progress)


def _write_mcore(plan: ConvertPlan, out: Path, iter_dir: Path, tensors: list, progress: Progress | None) -> None:
    from ckptscope.formats.megatron_write import write_torch_dist, write_torch_legacy

    by_name = {t.name: t for t in plan.tensors}

    def step(name_or_bytes) -> None:
        if progress:
            t = by_name.get(name_or_bytes) if isinstance(name_or_bytes, str) else None
            progress(t.name if t else "", t.nbytes if t else int(name_or_bytes or 0))
        if plan.ckpt_format == "torch":  # tensors come whole and are sliced per rank: drop their pages
            plan.reader.release_pages()

    args = dict(plan.megatron_args or {})
    if plan.ckpt_format == "torch":
        write_torch_legacy(iter_dir, tensors, args=args, iteration=plan.iteration, tp=plan.tp, pp=plan.pp,
                           ep=plan.ep, spec=plan.spec, progress=step)
    else:
        final = Path(plan.dst).resolve() / iter_dir.name  # .metadata records where it will live, not the temp dir
        write_torch_dist(iter_dir, tensors, args=args, iteration=plan.iteration, spec=plan.spec, progress=step,
                         checkpoint_id=str(final))
    (out / "latest_checkpointed_iteration.txt").write_text(f"{plan.iteration}\n")


def execute_convert(plan: ConvertPlan, *, overwrite: bool = False, progress: Progress | None = None) -> Path:
    dst = Path(plan.dst)
    check_destination(Path(plan.src), dst, overwrite=overwrite)
    with atomic_output(dst, directory=True, overwrite=overwrite) as staging:
        if plan.target == "hf":
            write_hf(plan, staging, progress)
        else:
            write_mcore(plan, staging, progress)
    return dst
