"""A NeMo 1.x ``.nemo`` file (FORMATS.md §9.2), read in place: no extraction, nothing loaded.

The archive (``formats.nemo.archive``) holds ``model_config.yaml`` (the model's OmegaConf config), the
tokenizer and other artifacts (named ``<uuid>_<file>``), and the weights in one of three layouts:

* ``model_weights.ckpt``: one ``torch.save`` of the model's state dict (``SaveRestoreConnector``; every
  model saved without model parallelism). Read here: each storage is a byte range of the ``.nemo`` file
  itself, so tensors are read lazily from the archive as from any torch file. The keys are the NeMo
  model's own (``model.decoder.layers.0...`` for a Megatron-Core GPT, ``model.`` being the module NeMo
  wraps), with TransformerEngine's ``_extra_state`` entries as objects.
* ``mp_rank_XX/model_weights.ckpt`` or ``tp_rank_XX_pp_rank_YYY/model_weights.ckpt``
  (``NLPSaveRestoreConnector`` under tensor/pipeline parallelism) and
* ``model_weights/``, a Megatron-Core distributed checkpoint (NeMo's ``dist_ckpt`` format): not read in
  place; the error says how to extract the archive and open what is inside.

A gzip-compressed ``.nemo`` (NeMo before 1.7) cannot be read in place either, and says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.config_yaml import load_config_yaml
from ckptscope.formats.pickles.torch_file import StoragePlacement, build_torch_index, read_torch_zip
from ckptscope.formats.registry import register_reader

if TYPE_CHECKING:
    from ckptscope.formats.nemo.archive import Member

SUFFIX = ".nemo"
WEIGHTS, CONFIG, DIST_WEIGHTS = "model_weights.ckpt", "model_config.yaml", "model_weights/"
CONFIG_OBJECT = "nemo_model_config"
"""The index object holding the parsed ``model_config.yaml``."""
_RANK_WEIGHTS = re.compile(r"^(?:mp_rank_\d+|tp_rank_\d+_pp_rank_\d+)/" + re.escape(WEIGHTS) + "$")


@register_reader
class NemoArchiveReader(CheckpointReader):
    format_name = "nemo"
    priority = 35

    @classmethod
    def supports(cls, path: Path) -> bool:
        """A file named ``*.nemo``: compressed or not, damaged or not, the user hears about it as one."""
        return path.suffix == SUFFIX and path.is_file()

    def _build_index(self) -> CheckpointIndex:
        # Here, not at the top: detection imports this module for every checkpoint past the torch readers.
        from ckptscope.formats.nemo.archive import is_gzip, looks_like_tar, members

        extract = f"extract it (mkdir DIR && tar -x{'z' if is_gzip(self.path) else ''}f {self.path.name} -C DIR)"
        if is_gzip(self.path):
            raise CkptError(f"a gzip-compressed .nemo (written by NeMo before 1.7): its members cannot be read in "
                            f"place; {extract} and open DIR/{WEIGHTS}", self.path)
        if not looks_like_tar(self.path):
            raise CkptError("not a .nemo archive: no tar header", self.path)
        if self.trust_pickle:
            raise CkptError(f"--trust-pickle does not load a member of a .nemo archive in place; {extract} and open "
                            f"DIR/{WEIGHTS}", self.path)
        found = members(self.path)
        by_name = {m.name: m for m in found if not m.is_dir}
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.files.append(FileInfo(self.path.name, self.path.stat().st_size, "data"))
        index.metadata["nemo"] = {"members": [{"name": m.name, "size": m.size} for m in found if not m.is_dir]}
        weights = by_name.get(WEIGHTS)
        if weights is None:
            ranks = sorted((m.name for m in found if _RANK_WEIGHTS.match(m.name)), key=_natural)
            if ranks:
                raise CkptError(f"a .nemo of {len(ranks)} model-parallel ranks ({ranks[0]} ... {ranks[-1]}), which "
                                f"ckptscope does not assemble inside the archive; {extract} and open each rank's "
                                f"{WEIGHTS}", self.path)
            if any(m.name.startswith(DIST_WEIGHTS) for m in found):
                raise CkptError(f"its weights are a Megatron-Core distributed checkpoint ({DIST_WEIGHTS}), which is "
                                f"not read inside the archive; {extract} and open DIR/{DIST_WEIGHTS.rstrip('/')}",
                                self.path)
            raise CkptError(f"no {WEIGHTS} in the archive (members: "
                            f"{', '.join(sorted(by_name)[:5]) or 'none'}): not a NeMo model", self.path)
        self._index_weights(index, weights)
        config = by_name.get(CONFIG)
        if config is not None:
            self._add_config(index, config)
        else:
            index.warnings.append(f"no {CONFIG} in the archive: the model's config is unknown")
        return index

    def _index_weights(self, index: CheckpointIndex, member: Member) -> None:
        from ckptscope.formats.nemo.archive import member_file

        with member_file(self.path, member) as window:
            try:
                parsed = read_torch_zip(self.path, window)
            except CkptError as exc:
                raise CkptError(f"{WEIGHTS} inside the archive: {exc.problem}", self.path) from None
        placements = {}
        for key, placement in parsed.storages.items():
            if placement.offset + placement.length > member.size:
                raise CkptError(f"{WEIGHTS} inside the archive: storage {key} runs past the member's "
                                f"{member.size:,} bytes (a truncated archive?)", self.path)
            placements[key] = StoragePlacement(member.offset + placement.offset, placement.length)
        build_torch_index(index, parsed.obj, self.path.name, placements, big_endian=parsed.big_endian,
                          path=self.path)
        if parsed.big_endian:
            index.metadata["byteorder"] = "big"

    def _add_config(self, index: CheckpointIndex, member: Member) -> None:
        """``model_config.yaml`` (``OmegaConf.save``: plain YAML) as the ``nemo_model_config`` object, read as data
        only (``formats.config_yaml``); a file that cannot be used is a warning."""
        from ckptscope.formats.nemo.archive import member_file

        try:
            with member_file(self.path, member) as window:
                data = load_config_yaml(window, member.size, "NeMo model_config.yaml")
        except (OSError, ValueError) as exc:
            index.warnings.append(f"{CONFIG} inside the archive: {exc}; the model's config is unknown")
            return
        index.objects.append(ObjectEntry(CONFIG_OBJECT, "dict", data))


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
