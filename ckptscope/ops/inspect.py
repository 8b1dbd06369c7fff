"""``inspect``: open a checkpoint, filter its tensors, and describe it as data (tree, JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptscope.core.index import CheckpointIndex
from ckptscope.core.names import select
from ckptscope.formats import open_checkpoint
from ckptscope.ops.model import ModelEntries, model_entries
from ckptscope.ops.tree import TreeNode, build_tree


@dataclass(slots=True)
class InspectReport:
    index: CheckpointIndex
    """The checkpoint's index restricted to the selected tensors."""
    total_tensors: int
    """Tensors in the checkpoint before ``--include``/``--exclude``."""
    filters: dict[str, list[str]] = field(default_factory=dict)
    model: ModelEntries | None = None
    """The selected tensors split into the model and its training state (``ops.model``)."""

    @property
    def entries(self) -> ModelEntries:
        if self.model is None:
            self.model = model_entries(self.index)
        return self.model

    def tree(self, *, collapse: bool = True) -> TreeNode:
        """The module tree of the model (and unknown entries) under their stored names; built only by
        the views that print it (``--json`` never does)."""
        training = set(self.entries.training_tensors())
        return build_tree([t for n, t in self.index.tensors.items() if n not in training], collapse=collapse)

    def training_tree(self, *, collapse: bool = True) -> TreeNode | None:
        """The training state's own tree (optimizer, scheduler, rng ...), or None when there is none."""
        state = self.entries.training_tensors()
        return build_tree(list(state.values()), collapse=collapse) if state else None


def inspect_checkpoint(path: str | Path, *, include: tuple[str, ...] = (), exclude: tuple[str, ...] = (),
                       trust_pickle: bool = False) -> InspectReport:
    with open_checkpoint(path, trust_pickle=trust_pickle) as reader:
        full = reader.index()
    names = select(full.tensors, include, exclude)
    index = CheckpointIndex(
        path=full.path, format=full.format, tensors={n: full.tensors[n] for n in names},
        objects=list(full.objects), metadata=dict(full.metadata), files=list(full.files),
        warnings=list(full.warnings),
        views={v: ref for v, ref in full.views.items() if ref[0] in names},
    )
    return InspectReport(index=index, total_tensors=len(full.tensors),
                         filters={"include": list(include), "exclude": list(exclude)},
                         model=model_entries(index))


def report_to_json(report: InspectReport) -> dict[str, Any]:
    """The ``inspect --json`` document: stored names and stored global shapes.

    ``num_params`` counts the model only; ``metadata["roles"]`` has the split (model prefix and
    naming, totals of the model and of each kind of training state, unknown entries) and each
    tensor its ``role``.
    """
    index = report.index
    entries = report.entries
    roles = entries.split.roles_by_name()
    metadata = dict(index.metadata)
    metadata.update({
        "files": [{"path": f.path, "size": f.size, "role": f.role} for f in index.files],
        "num_tensors": len(index),
        "num_params": entries.num_params,
        "num_params_all": index.num_params,
        "roles": entries.describe(),
        "bytes_per_dtype": index.bytes_per_dtype(),
        "warnings": list(index.warnings),
    })
    return {
        "path": index.path,
        "format": index.format,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "nbytes": t.nbytes,
                "role": roles.get(t.name, "unknown"),
                "chunks": [{"offsets": list(c.offsets), "shape": list(c.shape), "file": c.file} for c in t.chunks],
                **({"quantization": t.quantization} if t.quantization else {}),
            }
            for t in index.tensors.values()
        ],
        "objects": [{"name": o.name, "type": o.type} for o in index.objects],
        "metadata": metadata,
    }
