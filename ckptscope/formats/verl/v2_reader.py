"""A verl Megatron actor/critic dir in "layout schema v2" (``formats/verl/v2.py``) opened as one model.

The model part is a Megatron-Core torch_dist tree (``model/dist_ckpt/``) or, when mbridge saved it,
an HF dir of safetensors (``model/huggingface/``); the optimizer and RNG trees are added beside it
as training state (their names start ``optimizer.`` / ``lr_scheduler`` / ``rng_state``, which
``core.roles`` keeps out of the model). A save without ``ckpt_contents.json`` is still browsable, but
carries a ``missing-marker`` issue, so ``check`` fails it and save-root listings skip it by default.
"""

from __future__ import annotations

from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.formats.dcp.reader import group_summary
from ckptscope.formats.hf.reader import HFDirReader
from ckptscope.formats.megatron.dist_reader import MARKER_FILE, MegatronDistReader
from ckptscope.formats.registry import register_reader
from ckptscope.formats.verl.compose import ComposedReader
from ckptscope.formats.verl.reader import HF_SUBDIR, TRANSFORMER_CONFIG, _step_of, add_hf_subdir
from ckptscope.formats.verl.side_files import json_file
from ckptscope.formats.verl.v2 import MANIFEST, MODEL_HF, V2Layout, is_v2_dir, v2_layout


@register_reader
class VerlMegatronV2Reader(ComposedReader):
    """``model/``, ``optimizer/``, ``extra/`` + ``ckpt_contents.json``: see the module docstring."""

    format_name = "verl_megatron"
    priority = 71

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            return path.is_dir() and is_v2_dir(path)
        except OSError:
            return False

    def _build_index(self) -> CheckpointIndex:
        layout = v2_layout(self.path)
        if layout is None:
            raise CkptError("not a verl v2 checkpoint dir (no ckpt_contents.json, model/ or optimizer/)", self.path)
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        if layout.problem:
            index.add_issue("missing-marker", layout.problem, file=MANIFEST,
                            warning=f"incomplete save: {MANIFEST}: {layout.problem}")
        index.warnings.extend(layout.warnings)
        keys_at: dict[str, list[str]] = {}
        for key, rel in layout.missing:
            keys_at.setdefault(rel, []).append(key)
        for rel, keys in keys_at.items():
            gone = f"listed in {MANIFEST} ({', '.join(keys)}) but {'empty' if (self.path / rel).is_dir() else 'missing'}"
            if rel.endswith(".json"):  # a config file: said, and exports go on and say so
                index.add_issue("missing-file", gone, file=rel)
            else:  # training state verl's load_checkpoint opens: the model itself is whole
                index.add_issue("missing-state-file", f"{gone}: a resume from this save fails", file=rel)
        model_meta = self._add_model(index, layout)
        for rel in layout.training:
            self._add_dist(index, rel, model=False)
        if not index.tensors and not index.objects:
            raise CkptError(f"nothing readable: {'; '.join(index.warnings) or 'no model, optimizer or extra data'}",
                            self.path)
        index.metadata.update(model_meta)
        if any(isinstance(part, MegatronDistReader) for part in self._parts.values()):
            index.metadata["groups"] = group_summary(index.tensors)
        self._add_side_files(index, layout)
        return index

    def _add_model(self, index: CheckpointIndex, layout: V2Layout) -> dict:
        """Adopt the model part; its metadata (Megatron marker, HF weights kind) is returned to keep."""
        if layout.model is None:
            saved = (layout.manifest or {}).get("save_contents")
            index.warnings.append(f"no model weights in this save{f' (save_contents {saved})' if saved else ''}; "
                                  "showing the training state")
            return {}
        rel, kind = layout.model
        if kind == "hf":
            if not HFDirReader.supports(self.path / rel):
                index.add_issue("missing-file", "holds no model weights (*.safetensors / *.bin), though the "
                                f"{'manifest' if layout.manifest else 'layout'} puts the model there", file=rel)
                return {}
            return dict(self._adopt(index, HFDirReader(self.path / rel, trust_pickle=self.trust_pickle), rel).metadata)
        return self._add_dist(index, rel, model=True)

    def _add_dist(self, index: CheckpointIndex, rel: str, *, model: bool) -> dict:
        """Adopt one torch_dist tree, or record why it cannot be read (no Megatron marker: cut short)."""
        path = self.path / rel
        if not MegatronDistReader.supports(path):
            index.add_issue("missing-marker", f"no Megatron {MARKER_FILE} (written last by dist_checkpointing): "
                            f"the {'model' if model else 'training state'} in {rel}/ was not saved completely",
                            file=f"{rel}/{MARKER_FILE}")
            return {}
        try:
            sub = self._adopt(index, MegatronDistReader(path, trust_pickle=self.trust_pickle), rel)
        except CkptError as exc:
            if model:
                raise
            index.add_issue("unreadable-file", exc.problem, file=rel)
            return {}
        return dict(sub.metadata) if model else {}

    def _add_side_files(self, index: CheckpointIndex, layout: V2Layout) -> None:
        manifest = layout.manifest or {}
        info = {"backend": "megatron", "layout": "v2", "role": self.path.name,
                "model": layout.model[0] if layout.model else None,
                "model_format": layout.model[1] if layout.model else None,
                "complete": layout.problem is None}
        if layout.migrated:
            info["migrated"] = "from layout v1 by verl's migration script: model/, optimizer/ and extra/ mirror one tree"
        for key in ("save_contents", "world_size", "arch", "backend"):
            if key in manifest:
                info["manifest_backend" if key == "backend" else key] = manifest[key]
        index.metadata["verl"] = info
        step = manifest.get("global_step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else _step_of(self.path)
        if step is not None:
            index.metadata["iteration"] = step
        for name, obj_name in ((MANIFEST, "ckpt_contents"), (TRANSFORMER_CONFIG, "transformer_config")):
            file = self.path / name
            if not file.is_file():
                continue
            index.files.append(FileInfo(name, file.stat().st_size, "metadata" if name == MANIFEST else "config"))
            value, problem = json_file(file)
            if problem:
                index.warnings.append(problem)
            else:
                index.objects.insert(0, ObjectEntry(obj_name, "json", value))
        if layout.model is None or layout.model[1] != "hf":
            hf = self.path / MODEL_HF
            if hf.is_dir():
                add_hf_subdir(index, hf, MODEL_HF)
        legacy = self.path / HF_SUBDIR
        if legacy.is_dir():  # pre-v2 leftovers next to a v2 save (verl's migration hardlinks, never deletes)
            add_hf_subdir(index, legacy, HF_SUBDIR)

