"""A ``torch.save`` zip file (.pt/.pth/.bin/.ckpt): nested dicts flattened to dotted names."""

from __future__ import annotations

from pathlib import Path

from ckptscope.core.index import CheckpointIndex, FileInfo
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.pickles.torch_file import ZIP_MAGIC, build_torch_index, is_torch_zip, read_torch_zip
from ckptscope.formats.pickles.trusted import TrustedReadMixin, TrustedTorchFile
from ckptscope.formats.registry import register_reader

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _starts_with_zip_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == ZIP_MAGIC
    except OSError:
        return False


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
        if path.suffix in TORCH_SUFFIXES and _starts_with_zip_magic(path):
            return True
        return is_torch_zip(path)

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.files.append(FileInfo(self.path.name, self.path.stat().st_size, "data"))
        if self.trust_pickle:
            self._trusted = TrustedTorchFile(self.path, mmap=True)
            self._trusted.fill_index(index, self.path.name)
            return index
        parsed = read_torch_zip(self.path)
        build_torch_index(index, parsed.obj, self.path.name, parsed.storages,
                          big_endian=parsed.big_endian, path=self.path)
        if parsed.big_endian:
            index.metadata["byteorder"] = "big"
        return index

