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
from ckptscope.ops.convert.streaming import Prefetcher, Progress, file_runs


def write_hf(plan: ConvertPlan, out: Path, progress: Progress | None = None) -> None:
    by_name = {t.name: t for t in plan.tensors}
    weight_map: dict[str, str] = {}
    runs = {t.name: file_runs(plan, t) for t in plan.tensors}
    order = [by_name[n] for _, names in plan.shards for n in names if runs[n] is None]
    with Prefetcher(plan, order) as tensors_in_order:
        for filename, names in plan.shards:
            tensors = [by_name[n] for n in names]
            with open(out / filename, "wb") as handle:
                handle.write(new_file_header([(t.name, t.dtype, t.shape, t.nbytes) for t in tensors]))
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
