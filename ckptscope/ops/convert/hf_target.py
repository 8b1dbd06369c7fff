"""The HF target of ``convert`` / ``merge``: safetensors shards (+ index), ``config.json`` and the
tokenizer files copied from the source.

Tensors that are contiguous byte runs of the source are copied file to file by the kernel; the rest
come assembled from the ``Prefetcher`` in shard order.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.formats.filecopy import copy_range
from ckptscope.formats.safetensors.writer import new_file_header
from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Prefetcher, Progress, file_runs, note_tensor


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
    alone, so processes can share them (``ops.parallel``)."""
    by_name = {t.name: t for t in plan.tensors}
    shards = [(f, names) for f, names in plan.shards if files is None or f in files]
    runs = {n: file_runs(plan, by_name[n]) for _, names in shards for n in names}
    order = [by_name[n] for _, names in shards for n in names if runs[n] is None]
    with Prefetcher(plan, order) as tensors_in_order:
        for filename, names in shards:
            tensors = [by_name[n] for n in names]
            with open(out / filename, "wb") as handle:
                handle.write(new_file_header([(t.name, t.dtype, t.shape, t.nbytes) for t in tensors]))
                for t in tensors:
                    note_tensor(t.name)
                    spans = runs[t.name]
                    if spans is not None:
                        for path, offset, length in spans:
                            copy_range(path, handle, offset, length)
                        if progress:
                            progress(t.name, t.nbytes)
                        continue
                    array = tensors_in_order.get(t)
                    if array.shape != t.shape:
                        raise CkptError(f"{t.name}: assembled shape {array.shape} is not the planned {t.shape}")
                    handle.write(memoryview(array.reshape(-1).view("uint8")) if array.size else b"")
                    del array
                    if progress:
                        progress(t.name, t.nbytes)


def finish_hf(plan: ConvertPlan, out: Path) -> None:
    """The index (several shards), ``config.json`` and the copied tokenizer files, once every shard is written."""
    if len(plan.shards) > 1:
        weight_map = {n: filename for filename, names in plan.shards for n in names}
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
