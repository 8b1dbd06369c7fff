"""One reader per checkpoint format behind a registry. Reading metadata never imports torch."""

from ckptscope.formats.base import CheckpointReader, Region
from ckptscope.formats.registry import detect_format, open_checkpoint, register_reader, registered_readers

__all__ = ["CheckpointReader", "Region", "detect_format", "open_checkpoint", "register_reader", "registered_readers"]
