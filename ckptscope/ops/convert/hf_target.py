"""The HF target of ``convert`` / ``merge``: safetensors shards (+ index), ``config.json`` and the
tokenizer files copied from the source.

Tensors that are contiguous byte runs of the source are copied file to file; the rest come
assembled from the ``Prefetcher`` in shard order.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.formats.filefill import OutputFile
from ckptscope.formats.safetensors.writer import new_file_header
from ckptscope.mappings.config import set_config_dtype
from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Prefetcher, Progress, clear_failure, file_runs, note_failure, note_tensor

MAX_COPY_THREADS = 4
"""Threads copying at once when every tensor is a copy of source bytes: beyond a few, the page
cache, not the cores, is what they wait for."""
COPY_JOB = 64 << 20
"""Bytes per copy job: a large tensor is cut so the threads stay busy to the end."""


def write_hf(plan: ConvertPlan, out: Path, progress: Progress | None = None) -> None:
    write_hf_shards(plan, out, None, progress)
    finish_hf(plan, out)


def hf_shard_bytes(plan: ConvertPlan) -> dict[str, int]:
    """Tensor bytes of each shard file (what a split of the work between processes balances)."""
    by_name = {t.name: t for t in plan.tensors}
    return {filename: sum(by_name[n].nbytes for n in names) for filename, names in plan.shards}


def write_hf_shards(plan: ConvertPlan, out: Path, files: set[str] | None = None,
                    progress: Progress | None = None) -> None:
    """Write the safetensors shards ``files`` (all by default): each file's bytes depend on the plan
    alone, so processes can share them (``ops.parallel``).

    When every tensor is a copy of source bytes, a few threads fill the shards together, one shard
    included (``_copy_shards``: the copies then use every core, where ``cp`` uses one); otherwise
    shards are written one at a time, in the order the ``Prefetcher`` assembles tensors (which
    keeps the memory bound)."""
    clear_failure()
    by_name = {t.name: t for t in plan.tensors}
    shards = [(f, names) for f, names in plan.shards if files is None or f in files]
    runs = {n: file_runs(plan, by_name[n]) for _, names in shards for n in names}
    order = [by_name[n] for _, names in shards for n in names if runs[n] is None]
    lock = threading.Lock()

    def advance(name: str, nbytes: int) -> None:
        if progress:
            with lock:
                progress(name, nbytes)

    def write_shard(filename: str, names: list[str], prefetched: Prefetcher) -> None:
        tensors = [by_name[n] for n in names]
        target, position = _open_shard(out / filename, tensors)
        with target:
            for t in tensors:
                try:
                    write_tensor(target, position, t, prefetched)
                except BaseException:
                    note_failure(t.name)
                    raise
                position += t.nbytes

    def write_tensor(target: OutputFile, position: int, t, prefetched: Prefetcher) -> None:
        note_tensor(t.name)
        spans = runs[t.name]
        if spans is not None:
            for path, offset, length in spans:
                target.copy(path, offset, position, length)
                position += length
            advance(t.name, t.nbytes)
            return
        array = prefetched.get(t)
        if array.shape != t.shape:
            raise CkptError(f"{t.name}: assembled shape {array.shape} is not the planned {t.shape}")
        if array.size:
            target.write(position, memoryview(array.reshape(-1).view("uint8")))
        del array
        advance(t.name, t.nbytes)

    threads = min(os.cpu_count() or 1, MAX_COPY_THREADS)
    if not order and threads > 1:
        _copy_shards(out, shards, by_name, runs, advance, threads)
        return
    with Prefetcher(plan, order) as tensors_in_order:
        for filename, names in shards:
            write_shard(filename, names, tensors_in_order)


def _open_shard(path: Path, tensors: list) -> tuple[OutputFile, int]:
    """The shard file of ``tensors`` (in this order) at its planned size, its header written;
    returns it and where the first tensor's bytes go."""
    header = new_file_header([(t.name, t.dtype, t.shape, t.nbytes) for t in tensors])
    target = OutputFile(path, len(header) + sum(t.nbytes for t in tensors))
    try:
        target.write(0, header)
    except BaseException:
        target.close()
        raise
    return target, len(header)


def _copy_shards(out: Path, shards: list[tuple[str, list[str]]], by_name: dict, runs: dict,
                 advance: Callable[[str, int], None], threads: int) -> None:
    """Every tensor a copy of source byte runs: each shard is an ``OutputFile`` of its planned size,
    filled by ``threads`` threads taking jobs of at most ``COPY_JOB`` bytes in file order. One
    shard (the usual HF layout of a model under 5 GB) is then written by every thread at once,
    where ``write`` would hold them to one at a time on the file's lock."""
    files: list[OutputFile] = []
    jobs: list[tuple[OutputFile, str, Path, int, int, int]] = []
    left: dict[str, int] = {}
    try:
        for filename, names in shards:
            target, position = _open_shard(out / filename, [by_name[n] for n in names])
            files.append(target)
            for name in names:
                left[name] = 0
                for path, offset, length in runs[name]:
                    for start in range(0, length, COPY_JOB):
                        n = min(COPY_JOB, length - start)
                        jobs.append((target, name, path, offset + start, position + start, n))
                        left[name] += 1
                    position += length
                if not runs[name]:
                    advance(name, by_name[name].nbytes)
            if position != target.size:
                raise CkptError(f"internal error: {filename}: planned {target.size:,} bytes, copies fill {position:,}")
        lock = threading.Lock()
        queue = iter(jobs)
        failed = threading.Event()  # one thread's error stops the others at their next job

        def work() -> None:
            while not failed.is_set():
                with lock:
                    job = next(queue, None)
                if job is None:
                    return
                target, name, path, offset, position, length = job
                try:
                    note_tensor(name)
                    target.copy(path, offset, position, length)
                except BaseException:
                    failed.set()
                    note_failure(name)
                    raise
                with lock:
                    left[name] -= 1
                    done = left[name] == 0
                if done:
                    advance(name, by_name[name].nbytes)

        with ThreadPoolExecutor(threads, thread_name_prefix="ckptscope-write") as pool:
            for future in [pool.submit(work) for _ in range(threads)]:
                future.result()
    finally:
        for target in files:
            target.close()


def finish_hf(plan: ConvertPlan, out: Path) -> None:
    """The index (several shards), ``config.json`` and the copied tokenizer files, once every shard is written."""
    if len(plan.shards) > 1:
        weight_map = {n: filename for filename, names in plan.shards for n in names}
        index = {"metadata": {"total_size": plan.total_bytes}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = dict(plan.hf_config or {})
    dtypes = {t.dtype for t in plan.tensors if t.dtype.startswith(("float", "bfloat"))}
    if len(dtypes) == 1:
        set_config_dtype(config, dtypes.pop())
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if plan.generation_config is not None:
        (out / "generation_config.json").write_text(json.dumps(plan.generation_config, indent=2, sort_keys=True) + "\n")
    for source, name in plan.copies:
        if not (out / name).exists():
            shutil.copy2(source, out / name)
    if plan.adapter is not None:
        write_adapter(plan, out / plan.adapter.dir)


def write_adapter(plan: ConvertPlan, out: Path) -> None:
    """A PEFT-wrapped save's adapter as PEFT's ``save_pretrained`` writes one: ``adapter_config.json`` and
    ``adapter_model.safetensors``, the tensors as stored or cast to ``--dtype`` (an adapter is small: one tensor
    in memory at a time)."""
    adapter = plan.adapter
    assert adapter is not None
    out.mkdir()
    metas = [(name, plan.reader.meta(stored)) for name, stored in adapter.tensors]
    if adapter.dtype is not None:
        metas = [(name, replace(meta, dtype=adapter.dtype)) for name, meta in metas]
    with open(out / "adapter_model.safetensors", "wb") as handle:
        handle.write(new_file_header([(name, meta.dtype, meta.shape, meta.nbytes) for name, meta in metas]))
        for (_, stored), (_, meta) in zip(adapter.tensors, metas):
            array = plan.reader.read(stored)
            if adapter.dtype is not None:  # --dtype: the adapter too, as verl's merger casts both
                array = array.astype(dtype_by_name(adapter.dtype).numpy())
            if array.nbytes != meta.nbytes:
                raise CkptError(f"internal error: read {array.nbytes:,} bytes of {stored}, expected {meta.nbytes:,}")
            handle.write(memoryview(array.reshape(-1).view("uint8")) if array.size else b"")
    (out / "adapter_config.json").write_text(json.dumps(adapter.config, indent=2, sort_keys=True) + "\n")
