"""accelerate's per-rank FSDP save: ``save_fsdp_model(..., use_dcp=False)`` with ``SHARDED_STATE_DICT``.

Each rank ``torch.save``s its own sharded ``model.state_dict()`` (DTensor values under FSDP2,
ShardedTensor under FSDP1) to ``pytorch_model_fsdp_{i}_rank{R}.bin`` (``i`` the model's index), and
``save_fsdp_optimizer(..., use_dcp=False)`` its optimizer state to ``optimizer_{i}_rank{R}.bin``
(accelerate ``utils/fsdp_utils.py``). That is verl's rank-file layout under other names, so the verl
reader assembles it; only the names and the world size differ: accelerate's names do not carry the
world size, so it is read from the values (the DTensor's pickled mesh, the ShardedTensor's shard
placements) and a missing last rank's file is a hole, not a smaller model.

The dir read as an HF model of 0 tensors and ``check`` said ok (a probe). FSDP1 ``LOCAL_STATE_DICT``
files (flat parameters) can carry the same name for a second model; they stay refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.formats.pickles.dtensor import EXTRA_GLOBALS, Decoded, walk_state
from ckptscope.formats.pickles.torch_file import read_torch_zip
from ckptscope.formats.registry import register_reader
from ckptscope.formats.verl.reader import FsdpLayout, VerlFsdpReader

MODEL_RANK_FILE = re.compile(r"^pytorch_model_fsdp_(\d+)_rank(\d+)\.bin$")
OPTIM_RANK_FILE = re.compile(r"^optimizer_(\d+)_rank(\d+)\.bin$")
_KIND_PATTERNS = (("model", MODEL_RANK_FILE), ("optim", OPTIM_RANK_FILE))


def accelerate_rank_file(model_index: int) -> Callable[[str, int, int], str]:
    """The ``FsdpLayout.rank_file`` namer for model ``model_index``'s files."""

    def name(kind: str, world: int, rank: int) -> str:
        stem = "pytorch_model_fsdp" if kind == "model" else "optimizer"
        return f"{stem}_{model_index}_rank{rank}.bin"
    return name


def rank_files(path: Path) -> dict[int, dict[str, dict[int, str]]]:
    """model index -> kind (``model``/``optim``) -> rank -> file name. Never raises."""
    found: dict[int, dict[str, dict[int, str]]] = {}
    try:
        names = [p.name for p in path.iterdir() if p.is_file()]
    except OSError:
        return found
    for name in names:
        for kind, pattern in _KIND_PATTERNS:
            m = pattern.match(name)
            if m:
                found.setdefault(int(m.group(1)), {}).setdefault(kind, {})[int(m.group(2))] = name
    return {i: kinds for i, kinds in found.items() if "model" in kinds}


def saved_world(leaves: list[tuple[str, Any, Decoded | None]]) -> int | None:
    """The world size a rank file's values were sharded over (the largest any value records), from its
    ``walk_state`` leaves."""
    return max((d.world for _, _, d in leaves if d is not None and d.world is not None), default=None)


@register_reader
class AccelerateFsdpRanksReader(VerlFsdpReader):
    """A dir of accelerate ``pytorch_model_fsdp_{i}_rank{R}.bin`` files (module docstring)."""

    format_name = "accelerate_fsdp_ranks"
    priority = 68

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            return path.is_dir() and bool(rank_files(path))
        except OSError:
            return False

    def _layout(self) -> FsdpLayout:
        models = rank_files(self.path)
        if not models:
            raise CkptError("no pytorch_model_fsdp_<i>_rank<R>.bin files", self.path)
        first = min(models)
        files = models[first]
        namer = accelerate_rank_file(first)
        lowest = files["model"][min(files["model"])]
        leaves = list(walk_state(read_torch_zip(self.path / lowest, extra_globals=EXTRA_GLOBALS).obj, 0, 1))
        world = saved_world(leaves)
        if any("_flat_param" in name.split(".") for name, _, _ in leaves):
            raise CkptError(f"{lowest}: an accelerate FSDP LOCAL_STATE_DICT save (each rank's flattened "
                            f"parameters, no named weights), which ckptscope does not read; save with "
                            f"fsdp_state_dict_type SHARDED_STATE_DICT or FULL_STATE_DICT", self.path)
        source = "the saved values' mesh"
        if world is None:  # no value records it: the highest rank present is the last one
            world, source = max(r for ranks in files.values() for r in ranks) + 1, "file names"
        layout = FsdpLayout(world_size=world, source=source, fsdp_version=None, files=files, rank_file=namer)
        for ranks in layout.files.values():
            for r in sorted(r for r in ranks if r >= world):
                layout.warnings.append(f"{ranks.pop(r)}: rank {r} is outside world size {world}; ignored")
        others = sorted(i for i in models if i != first)
        if others:
            layout.warnings.append(f"rank files of {len(others) + 1} models: showing model {first} "
                                   f"(pytorch_model_fsdp_{first}_rank*.bin); the others "
                                   f"({', '.join(f'pytorch_model_fsdp_{i}_rank*.bin' for i in others)}) are not read")
        return layout

    def _build_index(self) -> CheckpointIndex:
        layout = self._layout()
        world = layout.world_size or 0
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.warnings.extend(layout.warnings)
        index.metadata["accelerate_fsdp"] = {"world_size": world, "world_size_from": layout.source,
                                             "state_dict": "SHARDED_STATE_DICT, one torch.save per rank"}
        for name in layout.missing("model"):
            index.add_issue("missing-file", f"missing (world size {world} from {layout.source}); "
                            "the shards it held cannot be read", file=name)
        assembled = self._read_rank_files(index, layout)
        self._finish(index, assembled, {r for r in range(world) if r not in layout.files["model"]}, world,
                     rank_file=layout.rank_file)
        self._add_side_files(index, layout)
        return index

    def _add_side_files(self, index: CheckpointIndex, layout: FsdpLayout) -> None:
        """The optimizer's rank files as one opaque object (a missing one warned about when the others
        are there); every other file in the dir listed (scheduler, rng states, other models' files)."""
        optim = layout.files.get("optim", {})
        sizes = {file: (self.path / file).stat().st_size for _, file in sorted(optim.items())}
        if sizes:
            index.objects.append(ObjectEntry("optim", "opaque torch.save per rank",
                                             {"files": len(sizes), "bytes": sum(sizes.values()), "per_file": sizes}))
            index.warnings.extend(f"{name}: missing" for name in layout.missing("optim"))
        for file, size in sizes.items():
            index.files.append(FileInfo(file, size, "optimizer"))
        listed = {f.path for f in index.files}
        for path in sorted(p for p in self.path.iterdir() if p.is_file() and p.name not in listed):
            index.files.append(FileInfo(path.name, path.stat().st_size, "other"))
