"""What a checkpoint *is*, independent of any file format: tensors made of chunks, objects, metadata.

Nothing in ``core`` imports torch, numpy or textual, so describing a checkpoint stays cheap.
"""

from ckptscope.core.dtypes import DType, dtype_by_name, dtype_by_safetensors, dtype_by_storage_class
from ckptscope.core.errors import CkptError, UnknownFormat
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta

__all__ = [
    "CheckpointIndex",
    "Chunk",
    "CkptError",
    "DType",
    "Encoding",
    "FileInfo",
    "ObjectEntry",
    "TensorMeta",
    "UnknownFormat",
    "dtype_by_name",
    "dtype_by_safetensors",
    "dtype_by_storage_class",
]
