"""Megatron-LM iteration dirs saved with ``--ckpt-format torch_dcp`` or ``fsdp_dtensor`` (FORMATS.md §4.10).

They are plain DCP directories (``DcpReader`` reads every chunk and bytes entry) that Megatron's
training loop wrote: no ``metadata.json``, no ``common.pt``, the run's ``args``, ``iteration`` and
``checkpoint_version`` stored as DCP bytes entries next to ``model.…``, ``optimizer.…``,
``rng_state.…``. This reader names them as Megatron saves (``index.metadata["megatron"]``:
``ckpt_format``), lifts the iteration and the other common values into the metadata, and shows
fsdp_dtensor's split SwiGLU fc1 fused (``dcp_layout.py``). The model prefix (``model.`` or
``model.module.``) and the optimizer state are told apart by ``core.roles`` like any wrapped model.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from ckptscope.core.index import CheckpointIndex
from ckptscope.formats.dcp.reader import METADATA_FILE, DcpReader, group_summary
from ckptscope.formats.megatron.dcp_layout import (
    FSDP_DTENSOR,
    FSDP_KEY_BYTES,
    TORCH_DCP,
    ckpt_format_of,
    fuse_split_fc1,
)
from ckptscope.formats.megatron.dist_reader import COMMON_FILE, MARKER_FILE, add_common_metadata, iteration_of_dir
from ckptscope.formats.pickles.safe import to_plain
from ckptscope.formats.registry import register_reader

COMMON_KEYS = ("args", "checkpoint_version", "iteration", "num_floating_point_operations_so_far")
"""Top-level entries of ``generate_state_dict`` that DCP stores as bytes entries."""
_SIGNATURE = b"checkpoint_version"
"""A key only Megatron's ``generate_state_dict`` puts into a DCP save (pickled verbatim in ``.metadata``)."""


def sniff_ckpt_format(path: Path) -> str | None:
    """``torch_dcp`` or ``fsdp_dtensor`` for a DCP dir (``.metadata``, no Megatron ``metadata.json``
    / ``common.pt``) whose keys include ``checkpoint_version``, else None. Scans ``.metadata``'s
    bytes, where the keys are pickled verbatim, without unpickling; never raises."""
    try:
        if not path.is_dir() or (path / MARKER_FILE).exists() or (path / COMMON_FILE).exists():
            return None
        with open(path / METADATA_FILE, "rb") as handle, \
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data.find(_SIGNATURE) < 0:
                return None
            return FSDP_DTENSOR if FSDP_KEY_BYTES.search(data) else TORCH_DCP
    except (OSError, ValueError):  # missing, unreadable or empty .metadata
        return None


@register_reader
class MegatronDcpReader(DcpReader):
    """A Megatron-LM torch_dcp / fsdp_dtensor iteration dir (``iter_0000500/``)."""

    format_name = "megatron_dcp"
    priority = 85

    @classmethod
    def supports(cls, path: Path) -> bool:
        return sniff_ckpt_format(path) is not None

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        contents = self.fill_index(index)
        add_common_metadata(index, {key: contents.objects[key] for key in COMMON_KEYS if key in contents.objects})
        if "iteration" not in index.metadata and (iteration := iteration_of_dir(self.path)) is not None:
            index.metadata["iteration"] = iteration
        fmt = ckpt_format_of(list(index.tensors))
        megatron: dict[str, object] = {"ckpt_format": fmt}
        args = to_plain(contents.objects.get("args"))
        run_format = args.get("ckpt_format") if isinstance(args, dict) else None
        if isinstance(run_format, str) and run_format != fmt:
            megatron["args_ckpt_format"] = run_format
            index.warnings.append(f"the keys are laid out as {fmt}, the stored args say --ckpt-format {run_format} "
                                  "(a converted checkpoint keeps its source run's args)")
        pp = args.get("pipeline_model_parallel_size") if isinstance(args, dict) else None
        if isinstance(pp, int) and pp > 1:
            index.warnings.append(f"saved with pipeline parallelism {pp}: Megatron keys {fmt} model layers by their "
                                  "stage-local index, so the stages' layers share names (Megatron-LM issue 7452)")
        index.metadata["megatron"] = megatron
        if fmt == FSDP_DTENSOR:
            index.tensors, warnings = fuse_split_fc1(index.tensors)
            index.warnings.extend(warnings)
        index.metadata["groups"] = group_summary(index.tensors)
        return index
