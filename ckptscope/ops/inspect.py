"""``inspect``: open a checkpoint, filter its tensors, and describe it as data (tree, JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.index import INFERRED_SHAPES, CheckpointIndex
from ckptscope.core.names import select
from ckptscope.core.roles import MODEL, UNKNOWN
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
    if INFERRED_SHAPES in full.metadata:  # inferred from the pieces found: config.json is the witness
        from ckptscope.ops.check import inferred_shape_problems

        full.warnings.extend(f"{p.file}: {p.detail}" for p in inferred_shape_problems(full))
    if include or exclude:
        names = select(full.tensors, include, exclude)
        index = CheckpointIndex(
            path=full.path, format=full.format, tensors={n: full.tensors[n] for n in names},
            objects=list(full.objects), metadata=dict(full.metadata), files=list(full.files),
            warnings=list(full.warnings),
            views={v: ref for v, ref in full.views.items() if ref[0] in names},
        )
    else:  # the reader is closed: its index is ours (no copy of 100k entries)
        index = full
    return InspectReport(index=index, total_tensors=len(full.tensors),
                         filters={"include": list(include), "exclude": list(exclude)},
                         model=model_entries(index))


def report_to_json(report: InspectReport) -> dict[str, Any]:
    """The ``inspect --json`` document: stored names and stored global shapes.

    ``num_params`` counts the model only; ``metadata["roles"]`` has the split (model prefix and
    naming, totals of the model and of each kind of training state, unknown entries) and each
    tensor its ``role``.
    """
    doc = _document(report)
    doc["tensors"] = _tensor_docs(report.index, report.entries.split.roles_by_name())
    return doc


def report_json_text(report: InspectReport, extra: dict[str, Any]) -> str:
    """``json.dumps(report_to_json(report) | extra)``, byte for byte (see ``report_json_chunks``)."""
    return "".join(report_json_chunks(report, extra))


def report_json_chunks(report: InspectReport, extra: dict[str, Any], *, batch: int = 4096) -> Iterator[str]:
    """``json.dumps(report_to_json(report) | extra)`` in pieces of ``batch`` tensors, byte for byte, in a
    fraction of the time; ``inspect --json`` writes each piece as it comes.

    The per-tensor entries are most of the document (issue 15: 100,000 tensors), and building a dict
    per tensor and chunk only for the encoder to walk them is most of its cost. Here each entry is
    written as text with the encoder's own string escaping (``encode_basestring_ascii``) and its
    separators; the text of a dtype, role, file or shape is made once with ``json.dumps`` and reused.
    Written in pieces, the document is never one string of tens of megabytes.
    """
    doc = _document(report)
    doc.update(extra)
    head = json.dumps({"path": doc.pop("path"), "format": doc.pop("format")})
    doc.pop("tensors")
    yield f'{head[:-1]}, "tensors": ['
    parts: list[str] = []
    split = report.entries.split
    every_model = split.all_model and len(split.stored) == len(report.index)
    for text in _tensor_texts(report.index, None if every_model else split.roles_by_name()):
        parts.append(text)
        if len(parts) == batch:
            yield ", ".join(parts)
            parts = [""]  # the next piece starts with the separator
    yield ", ".join(parts)
    yield f"], {json.dumps(doc)[1:]}"


def _document(report: InspectReport) -> dict[str, Any]:
    """The document with ``tensors`` left empty, in its place (keys keep their order)."""
    index = report.index
    described = report.entries.describe()
    metadata = dict(index.metadata)
    metadata.update({
        "files": [{"path": f.path, "size": f.size, "role": f.role} for f in index.files],
        "num_tensors": len(index),
        "num_params": described["model"]["params"],  # ModelEntries.num_params, counted once
        # The model is every tensor (the usual case): the same count, not another pass.
        "num_params_all": described["model"]["params"] if described["model"]["tensors"] == len(index)
        else index.num_params,
        "roles": described,
        "bytes_per_dtype": index.bytes_per_dtype(),
        "warnings": list(index.warnings),
    })
    return {
        "path": index.path,
        "format": index.format,
        "tensors": None,
        "objects": [{"name": o.name, "type": o.type} for o in index.objects],
        "metadata": metadata,
    }


def _tensor_docs(index: CheckpointIndex, roles: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for t in index.tensors.values():
        doc = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "nbytes": t.nbytes,
               "role": roles.get(t.name, "unknown"),
               "chunks": [{"offsets": list(c.offsets), "shape": list(c.shape), "file": c.file} for c in t.chunks]}
        quantization = t.quantization if t.attrs else None
        if quantization:
            doc["quantization"] = quantization
        out.append(doc)
    return out


def _tensor_texts(index: CheckpointIndex, roles: dict[str, str] | None) -> Iterator[str]:
    """Each entry of ``_tensor_docs`` as ``json.dumps`` writes it (see ``report_json_chunks``). Runs once
    per tensor, so a plain tensor's bytes come from its dtype's bits, and the texts of dtypes, shapes,
    offsets and files are memoised by value (a shape is a tuple of ints; the others are str), with the
    previous tensor's dtype and file tried first by identity: neighbours share them."""
    escape = encode_basestring_ascii
    dumps = json.dumps
    prod = math.prod
    strings: dict[str, str] = {}
    tuples: dict[tuple[int, ...], str] = {}
    dtypes: dict[str, tuple[str, int]] = {}  # dtype -> (its JSON text, bits)
    last_dtype, dtype_text, bits = None, "", 0
    last_file, file_text = None, ""
    for t in index.tensors.values():
        if t.dtype is not last_dtype:
            last_dtype = t.dtype
            found = dtypes.get(last_dtype)
            if found is None:
                found = dtypes[last_dtype] = (escape(last_dtype), dtype_by_name(last_dtype).bits)
            dtype_text, bits = found
        shape = tuples.get(t.shape)
        if shape is None:
            shape = tuples[t.shape] = dumps(list(t.shape))
        role = roles.get(t.name, UNKNOWN) if roles is not None else MODEL
        role_text = strings.get(role) or strings.setdefault(role, escape(role))
        chunks = t.chunks
        if not t.attrs and len(chunks) == 1:  # the common case, in one f-string
            c = chunks[0]
            if c.file is not last_file:
                last_file = c.file
                file_text = strings.get(last_file) or strings.setdefault(last_file, escape(last_file))
            offsets = tuples.get(c.offsets) or tuples.setdefault(c.offsets, dumps(list(c.offsets)))
            chunk_shape = shape if c.shape is t.shape else (
                tuples.get(c.shape) or tuples.setdefault(c.shape, dumps(list(c.shape))))
            yield (f'{{"name": {escape(t.name)}, "dtype": {dtype_text}, "shape": {shape}, "nbytes": '
                   f'{(prod(t.shape) * bits + 7) // 8}, "role": {role_text}, "chunks": [{{"offsets": {offsets}, '
                   f'"shape": {chunk_shape}, "file": {file_text}}}]}}')
            continue
        texts = []
        for c in chunks:
            offsets = tuples.get(c.offsets) or tuples.setdefault(c.offsets, dumps(list(c.offsets)))
            chunk_shape = tuples.get(c.shape) or tuples.setdefault(c.shape, dumps(list(c.shape)))
            file = strings.get(c.file) or strings.setdefault(c.file, escape(c.file))
            texts.append(f'{{"offsets": {offsets}, "shape": {chunk_shape}, "file": {file}}}')
        quantization = t.quantization if t.attrs else None
        tail = f', "quantization": {dumps(quantization)}}}' if quantization else "}"
        yield (f'{{"name": {escape(t.name)}, "dtype": {dtype_text}, "shape": {shape}, "nbytes": {t.nbytes}, '
               f'"role": {role_text}, "chunks": [{", ".join(texts)}]{tail}')
