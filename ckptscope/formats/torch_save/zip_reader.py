"""A ``torch.save`` zip file (.pt/.pth/.bin/.ckpt): nested dicts flattened to dotted names.

One rank's file of a sharded state dict (FSDP ``SHARDED_STATE_DICT`` saved with ``torch.save`` per
rank: DTensor values under FSDP2, ShardedTensor under FSDP1) holds a piece of each tensor: it is
shown as the global tensors with this file's pieces at their offsets, so ``check`` lists the other
ranks' parts as holes and exports refuse it. It read as 0 tensors (DTensor) or failed to unpickle
(ShardedTensor pickles ``getattr(ShardedTensor, "ProcessGroupState")``) (a probe).
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import TensorMeta
from ckptscope.formats.base import CheckpointReader, starts_with
from ckptscope.formats.pickles.safe import to_plain, type_name
from ckptscope.formats.pickles.torch_file import (
    ZIP_MAGIC,
    TorchZip,
    build_torch_index,
    is_torch_zip,
    read_torch_zip,
    piece_chunk,
)
from ckptscope.formats.pickles.trusted import TrustedReadMixin, TrustedTorchFile
from ckptscope.formats.registry import register_reader

_RANK = re.compile(r"rank_?(\d+)")
_WORLD = re.compile(r"world_size_?(\d+)")
_SHARDED_KINDS = ("DTensor", "ShardedTensor")

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@register_reader
class TorchZipReader(TrustedReadMixin, CheckpointReader):
    format_name = "torch"
    priority = 30

    @classmethod
    def supports(cls, path: Path) -> bool:
        """A zip with ``<prefix>/data.pkl``; a torch-named zip that is corrupt is ours too, so
        the user hears "corrupt torch zip" rather than "unknown format"."""
        if not path.is_file():
            return False
        if path.suffix in TORCH_SUFFIXES and starts_with(path, ZIP_MAGIC):
            return True
        return is_torch_zip(path)

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.files.append(FileInfo(self.path.name, self.path.stat().st_size, "data"))
        if self.trust_pickle:
            self._trusted = TrustedTorchFile(self.path, mmap=True)
            self._trusted.fill_index(index, self.path.name)
            return index
        # Here, not at the top: detection imports this module for every checkpoint, HF dirs included.
        from ckptscope.formats.pickles.dtensor import EXTRA_GLOBALS

        try:
            parsed = read_torch_zip(self.path)
        except CkptError:
            try:  # a ShardedTensor rank file needs the stub getattr (formats.pickles.dtensor)
                parsed = read_torch_zip(self.path, extra_globals=EXTRA_GLOBALS)
            except CkptError:
                parsed = None
            if parsed is None or not self._rank_pieces(index, parsed):
                raise
            return index
        if not self._rank_pieces(index, parsed):
            build_torch_index(index, parsed.obj, self.path.name, parsed.storages,
                              big_endian=parsed.big_endian, path=self.path)
            _note_deepspeed_model_states(index, self.path)
        if parsed.big_endian:
            index.metadata["byteorder"] = "big"
        return index

    def _rank_pieces(self, index: CheckpointIndex, parsed: TorchZip) -> bool:
        """Fill ``index`` from one rank's file of a sharded state dict (module docstring); False, having
        changed nothing, when the file holds no DTensor or ShardedTensor value."""
        from ckptscope.formats.pickles.dtensor import holds_sharded, walk_state

        if not holds_sharded(parsed.obj):
            return False
        rank_match, world_match = _RANK.search(self.path.stem), _WORLD.search(self.path.stem)
        rank = int(rank_match.group(1)) if rank_match else 0
        world = int(world_match.group(1)) if world_match else 1
        leaves = list(walk_state(parsed.obj, rank, world))
        kinds = sorted({d.kind for _, _, d in leaves if d is not None and d.kind in _SHARDED_KINDS})
        if not kinds or any("_flat_param" in name.split(".") for name, _, _ in leaves):
            return False  # FSDP1 LOCAL_STATE_DICT: flat parameters, no named weights (refused by the parser)
        file = self.path.name
        for name, leaf, decoded in leaves:
            if decoded is None or decoded.problem is not None:
                if decoded is not None:
                    index.warnings.append(f"{name}: {decoded.problem}; shown as an object")
                index.objects.append(ObjectEntry(name or "<root>", type_name(leaf), to_plain(leaf)))
                continue
            chunks = []
            for piece in decoded.pieces:
                if piece.ref.numel == 0:
                    continue
                chunks.append(piece_chunk(name, piece.ref, piece.offsets, file, parsed, self.path))
            index.tensors[name] = TensorMeta(name=name, dtype=decoded.dtype, shape=decoded.shape,
                                             chunks=tuple(chunks), attrs=decoded.attrs)
        index.metadata["sharded_rank_file"] = {"kinds": kinds, "rank": rank if rank_match else None}
        index.warnings.append(
            f"one rank's file of a sharded state dict ({' and '.join(kinds)} values{f', rank {rank}' if rank_match else ''}): "
            "each tensor has its global shape and only this file's pieces; the other ranks' parts are not "
            "here (check lists them as holes, exports refuse). A set of rank files laid out as verl saves "
            "them (model_world_size_W_rank_R.pt) opens as the whole model")
        return True


_DEEPSPEED_MODEL_STATES = {"ds_version", "param_shapes", "dp_world_size"}
"""Top-level keys of DeepSpeed's ``*mp_rank_XX_model_states.pt`` (``engine.save_checkpoint``)."""


def _note_deepspeed_model_states(index: CheckpointIndex, path: Path) -> None:
    """One DeepSpeed model-states file opened on its own says what it is (a probe read a ZeRO-3 one as a
    model of 0 parameters that checked ok). Under ZeRO-3 its module holds placeholders of 0 elements:
    an ``unassembled-file`` issue (``check`` exits 1, exports refuse with this line). Under ZeRO-0/1/2 it
    holds the engine's working copy (bf16 under bf16 training), while the fp32 masters that DeepSpeed's
    ``zero_to_fp32`` exports are in the optimizer files beside it: a warning."""
    if not _DEEPSPEED_MODEL_STATES <= {o.name for o in index.objects}:
        return
    tag = path.parent
    module = [m for name, m in index.tensors.items() if name.startswith("module.")]
    if module and all(m.numel == 0 for m in module):
        index.add_issue("unassembled-file", f"a DeepSpeed ZeRO-3 model-states file: its module holds placeholders "
                        f"of 0 elements, the weights are partitioned across the optimizer files beside it; open "
                        f"the tag dir ({tag}) instead", file=path.name)
    else:
        index.warnings.append(f"a DeepSpeed model-states file: the module as the engine held it (its working dtype); "
                              f"the fp32 master weights, which DeepSpeed's zero_to_fp32 exports, are in the "
                              f"optimizer files: open the tag dir ({tag}) for them")
