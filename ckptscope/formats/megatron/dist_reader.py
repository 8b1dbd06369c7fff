"""Megatron-Core ``dist_checkpointing`` iteration dirs (``--ckpt-format torch_dist``), FORMATS.md §4.

Underneath it is a DCP directory (``DcpReader`` does the chunks and bytes entries); Megatron adds:

* ``metadata.json`` with ``sharded_backend`` (written last, so it marks a complete save);
* ``common.pt`` (core <= 0.18) or the ``common_state`` ShardedObject (0.19+): args, iteration,
  checkpoint_version, optimizer param groups ... shown as objects; iteration goes to
  ``index.metadata["iteration"]``; Megatron-Bridge saves carry their config in ``run_config.yaml`` instead
  (run_config.py);
* stacked layers: a homogeneous ``TransformerBlock`` saves all layers of one parameter as one
  tensor ``decoder.layers.<suffix>`` whose axis 0 is the global layer index. It is kept as stored
  and also exposed as per-layer views ``decoder.layers.{i}.<suffix>`` (``CheckpointIndex.views``),
  the names per-layer checkpoints and HF mappings use. Per-layer keys (non-homogeneous stacks,
  MoE with dense layers) are already ``decoder.layers.{i}.…`` and stay as they are;
* optimizer state (``optimizer.state.<name>.<param key>``, distributed-optimizer buckets
  ``optimizer.distributed.…``) is tagged ``group=optimizer`` and counted apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import TensorMeta
from ckptscope.formats.dcp.reader import METADATA_FILE, DcpContents, DcpReader, group_summary
from ckptscope.formats.pickles.safe import TensorRef, to_plain, type_name
from ckptscope.formats.megatron.dcp_layout import fuse_split_fc1
from ckptscope.formats.megatron.nemo_context import add_nemo_context
from ckptscope.formats.megatron.run_config import add_run_config
from ckptscope.formats.pickles.torch_file import flatten, read_torch_zip, tensor_meta
from ckptscope.formats.registry import register_reader

MARKER_FILE = "metadata.json"
COMMON_FILE = "common.pt"
COMMON_STATE_KEY = "common_state/shard_0_1"
_ITER_DIR = re.compile(r"iter_(\d+)$")
_COMMON_METADATA = ("iteration", "checkpoint_version", "num_floating_point_operations_so_far",
                    "content_metadata")


def read_marker(path: Path) -> dict[str, Any] | None:
    """The parsed ``metadata.json`` if it is a Megatron dist-checkpoint marker, else None. Never raises."""
    try:
        data = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) and "sharded_backend" in data else None


def _damaged_marker(path: Path) -> bool:
    """A torch_dist save (``common.pt`` beside DCP's ``.metadata``) whose ``metadata.json`` is there but
    unreadable: claimed, so ``check`` reports the damaged marker instead of it passing as plain DCP."""
    try:
        return all((path / name).is_file() for name in (MARKER_FILE, COMMON_FILE, METADATA_FILE))
    except OSError:
        return False


def stacked_view_name(name: str) -> tuple[str, str] | None:
    """Split a stacked key at its ``layers`` segment: ``(before + "layers", after)``, or None when
    the segment after ``layers`` is already a layer number (a per-layer key)."""
    parts = name.split(".")
    for j, part in enumerate(parts[:-1]):
        if part == "layers":
            if parts[j + 1].isdigit():
                return None
            return ".".join(parts[: j + 1]), ".".join(parts[j + 1:])
    return None


def stacked_layer_views(tensors: dict[str, TensorMeta]) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """Per-layer views of every stacked tensor, and warnings for views that would shadow a stored name."""
    views: dict[str, tuple[str, int]] = {}
    warnings: list[str] = []
    for name, meta in tensors.items():
        split = stacked_view_name(name)
        if split is None or not meta.shape:
            continue
        head, tail = split
        for layer in range(meta.shape[0]):
            view = f"{head}.{layer}.{tail}"
            if view in tensors:
                warnings.append(f"{name}: layer {layer} view {view!r} clashes with a stored tensor; not shown")
                continue
            views[view] = (name, layer)
    return views, warnings


def iteration_of_dir(path: Path) -> int | None:
    """The iteration a Megatron ``iter_0000500`` dir name says, or None."""
    match = _ITER_DIR.fullmatch(path.name)
    return int(match.group(1)) if match else None


def add_common_metadata(index: CheckpointIndex, common: dict[str, Any]) -> None:
    """Copy iteration, checkpoint_version, FLOPs so far and content metadata from Megatron's
    common state into ``index.metadata`` (values already there win)."""
    for key in _COMMON_METADATA:
        value = common.get(key)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            index.metadata.setdefault(key, value)
        elif isinstance(value, dict):
            index.metadata.setdefault(key, to_plain(value))


@register_reader
class MegatronDistReader(DcpReader):
    """A Megatron-Core torch_dist iteration dir (``iter_0000500/``)."""

    format_name = "megatron_dist"
    priority = 80

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            if not path.is_dir():
                return False
        except OSError:
            return False
        marker = read_marker(path)
        if marker is None:
            return _damaged_marker(path)
        # zarr (removed in core 0.16) is claimed too, to be refused by name rather than as "not a checkpoint"
        return marker.get("sharded_backend") in ("torch_dist", "zarr")

    def _build_index(self) -> CheckpointIndex:
        found = read_marker(self.path)
        marker = found or {}
        if marker.get("sharded_backend") == "zarr":
            raise CkptError("a Megatron-Core dist checkpoint in the zarr backend (metadata.json sharded_backend "
                            "'zarr', removed in megatron-core 0.16), which ckptscope does not read; re-save it "
                            "as torch_dist (Megatron-LM --ckpt-format torch_dist)", self.path)
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.metadata["megatron"] = dict(marker)
        contents: DcpContents | None = None
        if (self.path / METADATA_FILE).is_file():
            contents = self.fill_index(index)
            # megatron-core's singleton_local_shards layout (Megatron-LM 0.14/0.15 --dist-ckpt-save-pre-mcore-014,
            # still loaded by 0.16) splits the SwiGLU fc1 into ``_w`` (gate) / ``_v`` (up) as fsdp_dtensor does
            index.tensors, fused_warnings = fuse_split_fc1(index.tensors)
            index.warnings.extend(fused_warnings)
        else:  # an incomplete save: common.pt (args, iteration) is still worth showing
            self.index_without_metadata(index)
        index.files.append(FileInfo(MARKER_FILE, (self.path / MARKER_FILE).stat().st_size, "metadata"))
        if found is None:
            index.add_issue("unreadable-file", "not Megatron-Core's completion marker (not JSON, or no "
                            "sharded_backend): the save may not have finished; read as torch_dist", file=MARKER_FILE)
        self._add_common(index, contents)
        add_run_config(index, self.path)  # Megatron-Bridge's saves: the model config (no args in common.pt)
        add_nemo_context(index, self.path)  # NeMo 2.0's weights/: the model config is in ../context/model.yaml
        if "iteration" not in index.metadata and (iteration := iteration_of_dir(self.path)) is not None:
            index.metadata["iteration"] = iteration
        if contents is not None:
            self._annotate(index, contents)
        index.views, warnings = stacked_layer_views(index.tensors)
        index.warnings.extend(warnings)
        index.metadata["groups"] = group_summary(index.tensors)
        return index

    def _add_common(self, index: CheckpointIndex, contents: DcpContents | None) -> None:
        """``common.pt`` (core <= 0.18) or the ``common_state`` ShardedObject (0.19+)."""
        sharded_objects, index.objects = index.objects, []
        consumed = False
        try:
            consumed = self._add_common_state(index, contents)
        finally:  # args/iteration first, then the ShardedObjects (rng, _extra_state ...)
            index.objects.extend(o for o in sharded_objects if not (consumed and o.name == COMMON_STATE_KEY))

    def _add_common_state(self, index: CheckpointIndex, contents: DcpContents | None) -> bool:
        """Add the common objects; True when they came from (and replace) the common_state object."""
        common_path = self.path / COMMON_FILE
        if common_path.is_file():
            consumed = False
            try:
                parsed = read_torch_zip(common_path)
            except CkptError as exc:  # a damaged common.pt: the sharded tensors are still readable
                index.add_issue("unreadable-file", exc.problem, file=COMMON_FILE)
                return False
            index.files.append(FileInfo(COMMON_FILE, common_path.stat().st_size, "common"))
            obj = parsed.obj
            # One object per top-level key (args, iteration, optimizer ...), not one "<root>" dict.
            for key, value in (obj.items() if isinstance(obj, dict) else [("common", obj)]):
                for name, leaf in flatten(value, str(key)):
                    if isinstance(leaf, TensorRef) and leaf.storage is not None:
                        target = name if name not in index.tensors else f"common.{name}"
                        meta = tensor_meta(target, leaf, COMMON_FILE, parsed.storages.get(leaf.storage.key),
                                           big_endian=parsed.big_endian, path=common_path)
                        index.tensors[target] = replace(meta, attrs=meta.attrs + (("group", "common"),))
                    else:
                        index.objects.append(ObjectEntry(name, type_name(leaf), to_plain(leaf)))
        elif contents is not None and isinstance(contents.objects.get(COMMON_STATE_KEY), list) \
                and contents.objects[COMMON_STATE_KEY]:
            obj = contents.objects[COMMON_STATE_KEY][0]
            consumed = True
            if isinstance(obj, dict):
                for key, value in obj.items():
                    index.objects.append(ObjectEntry(str(key), type_name(value), to_plain(value)))
        else:
            if contents is not None:
                index.add_issue("missing-file", "not found, and .metadata has no common_state object either: args "
                                "and iteration are unknown", file=COMMON_FILE,
                                warning="no common.pt and no common_state object: args and iteration are unknown")
            return False
        if isinstance(obj, dict):
            add_common_metadata(index, obj)
        return consumed

    @staticmethod
    def _annotate(index: CheckpointIndex, contents: DcpContents) -> None:
        """Mark stacked tensors, distributed-optimizer buckets and pre-0.14 flattened tensors."""
        mcore_data = contents.metadata.extra.get("mcore_data")
        flattened = 0
        for name, meta in list(index.tensors.items()):
            extra: tuple[tuple[str, str], ...] = ()
            if stacked_view_name(name) is not None and meta.shape:
                extra += (("stacked_layers", str(meta.shape[0])),)
            if name.startswith("optimizer.distributed.") or ".optimizer.distributed." in name:
                extra += (("layout", "distributed-optimizer bucket (flat, DP-sharded param space)"),)
            info = mcore_data.get(name) if isinstance(mcore_data, dict) else None
            orig = info.get("nd_reformulated_orig_global_shape") if isinstance(info, dict) else None
            if isinstance(orig, (list, tuple)):
                extra += (("orig_global_shape", str(list(orig))),)
                flattened += 1
            if extra:
                index.tensors[name] = replace(meta, attrs=meta.attrs + extra)
        if flattened:
            index.warnings.append(f"{flattened} tensors are stored flattened (pre-0.14 distributed optimizer); "
                                  "shown with their on-disk reformulated shape")
