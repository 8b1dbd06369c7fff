"""The one safe unpickler used for every pickle ckptscope touches.

It never imports a module named in the pickle and never calls anything the pickle names, except
a short allowlist of data constructors (OrderedDict, set, torch's tensor rebuild functions, which
are replaced by functions that only record a reference). Every other global becomes an inert
*stub class* that remembers its module, name, constructor arguments and state, so a Megatron
``argparse.Namespace`` still reads as a dict and a malicious ``__reduce__`` (``os.system``,
``builtins.eval`` ...) produces a harmless stub instead of running.

Reference: FORMATS.md §2.2-§2.3 and §10 (layout of torch pickles; the stub approach).
"""

from __future__ import annotations

import collections
import io
import math
import pickle
from dataclasses import dataclass
from typing import IO, Any

from ckptscope.core.dtypes import DType, dtype_by_name, dtype_by_storage_class
from ckptscope.core.errors import CkptError


@dataclass(frozen=True, slots=True)
class StorageRef:
    """A persistent id from a torch pickle: which storage record holds the bytes."""

    key: str
    dtype: DType
    """Element type of the storage (uint8 for ``UntypedStorage``)."""
    location: str
    numel: int
    """Length in elements of ``dtype``."""
    storage_type: str = "torch.FloatStorage"
    """The storage class global as pickled (``torch.BFloat16Storage``, ``torch.UntypedStorage``)."""

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes(self.numel)


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor described by the pickle, without its data: where it lives inside its storage."""

    storage: StorageRef | None
    storage_offset: int
    """In elements of ``dtype``."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: DType
    kind: str = "Tensor"
    """``Tensor``, ``Parameter``, or the subclass name for wrapper subclasses."""
    requires_grad: bool = False
    """Kept so a re-pickled file (rename) says exactly what the original said."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    @property
    def span_elements(self) -> int:
        """Elements of the storage touched, counted from ``storage_offset``."""
        if self.numel == 0:
            return 0
        return 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride))


class StorageType:
    """Stands for ``torch.FloatStorage`` & co. in persistent ids."""

    def __init__(self, class_name: str, module: str = "torch") -> None:
        self.class_name = class_name
        self.module = module
        self.dtype = dtype_by_storage_class(class_name)

    def __repr__(self) -> str:
        return f"StorageType({self.class_name})"


class PickleStub:
    """Base of the inert classes that replace every global the pickle names.

    Subclasses are created per (module, name); instances record how the pickle tried to build
    them. Nothing about them is executable.
    """

    stub_module: str = ""
    stub_name: str = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> "PickleStub":
        obj = object.__new__(cls)
        object.__setattr__(obj, "args", args)
        object.__setattr__(obj, "kwargs", kwargs)
        object.__setattr__(obj, "state", None)
        object.__setattr__(obj, "items", [])
        object.__setattr__(obj, "dict_items", {})
        object.__setattr__(obj, "called", False)
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Only REDUCE (``cls(*args)``) runs __init__; NEWOBJ calls ``cls.__new__`` alone. Recording
        # which one built the object lets a rename write the same opcodes back.
        object.__setattr__(self, "called", True)

    def __setstate__(self, state: Any) -> None:
        object.__setattr__(self, "state", state)

    # Containers built by REDUCE (list / dict subclasses) are filled with APPENDS / SETITEMS.
    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dict_items[key] = value

    def __setattr__(self, key: str, value: Any) -> None:  # BUILD with slot state
        self.dict_items[key] = value

    @classmethod
    def qualname(cls) -> str:
        return f"{cls.stub_module}.{cls.stub_name}"

    def __repr__(self) -> str:
        return f"<stub {self.qualname()}>"


_STUB_CLASSES: dict[tuple[str, str], type[PickleStub]] = {}


def stub_class(module: str, name: str) -> type[PickleStub]:
    """The (cached) inert stand-in for ``module.name``."""
    key = (module, name)
    cls = _STUB_CLASSES.get(key)
    if cls is None:
        cls = type(f"Stub[{module}.{name}]", (PickleStub,), {"stub_module": module, "stub_name": name})
        _STUB_CLASSES[key] = cls
    return cls


# --- the allowlisted constructors ----------------------------------------------------------------


def _tensor_ref(storage: Any, offset: Any, size: Any, stride: Any, dtype: DType | None = None,
                requires_grad: Any = False) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise pickle.UnpicklingError("tensor rebuilt from something that is not a storage")
    return TensorRef(
        storage=storage,
        storage_offset=int(offset),
        shape=tuple(int(s) for s in size),
        stride=tuple(int(s) for s in stride),
        dtype=dtype or storage.dtype,
        requires_grad=requires_grad is True,
    )


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                    *_: Any) -> TensorRef:
    return _tensor_ref(storage, offset, size, stride, requires_grad=requires_grad)


def _rebuild_tensor_v3(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, _hooks: Any, dtype: Any, *_: Any
) -> TensorRef:
    if not isinstance(dtype, DType):
        raise pickle.UnpicklingError("tensor rebuilt with an unknown dtype")
    return _tensor_ref(storage, offset, size, stride, dtype, requires_grad)


def _rebuild_parameter(data: Any, requires_grad: Any = False, *_: Any) -> Any:
    if isinstance(data, TensorRef):
        return TensorRef(data.storage, data.storage_offset, data.shape, data.stride, data.dtype, "Parameter",
                         requires_grad is True)
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """Tensor subclasses: rebuild the plain tensor with our own function, remember the subclass."""
    if func in _SAFE_REBUILDERS:
        result = func(*args)
        if isinstance(result, TensorRef) and isinstance(new_type, type) and issubclass(new_type, PickleStub):
            return TensorRef(result.storage, result.storage_offset, result.shape, result.stride,
                             result.dtype, new_type.qualname(), result.requires_grad)
        return result
    return stub_class("torch._tensor", "_rebuild_from_type_v2")(func, new_type, args, state)


def _torch_size(*args: Any) -> tuple[int, ...]:
    return tuple(args[0]) if args else ()


def _codecs_encode(text: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Protocol-2 pickles spell ``bytes`` as ``_codecs.encode(str, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise pickle.UnpicklingError("unexpected _codecs.encode call")
    return text.encode(encoding, errors)


def _safe_reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    """``copyreg._reconstructor`` restricted to stubs (it is how protocol 0/1 build objects)."""
    if isinstance(cls, type) and issubclass(cls, PickleStub):
        obj = cls.__new__(cls)
        if state is not None:
            obj.__setstate__(state)
        return obj
    raise pickle.UnpicklingError("copyreg._reconstructor on a non-stub class")


_SAFE_REBUILDERS = {_rebuild_tensor, _rebuild_tensor_v3, _rebuild_parameter}

_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("__builtin__", "set"): set,
    ("_codecs", "encode"): _codecs_encode,
    ("copyreg", "_reconstructor"): _safe_reconstructor,
    ("copy_reg", "_reconstructor"): _safe_reconstructor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): _torch_size,
}


class SafeUnpickler(pickle.Unpickler):
    """Unpickles torch/Megatron/DCP pickles into plain data, TensorRefs and stubs.

    ``extra_globals`` lets a format add its own safe stand-ins (e.g. DCP metadata dataclasses);
    they must be data-only classes defined by ckptscope.
    """

    def __init__(self, file: IO[bytes], extra_globals: dict[tuple[str, str], Any] | None = None) -> None:
        super().__init__(file)
        self._extra = extra_globals or {}

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in self._extra:
            return self._extra[key]
        if key in _ALLOWED:
            return _ALLOWED[key]
        if module in ("torch", "torch.storage", "torch.cuda") and name.endswith("Storage"):
            try:
                return StorageType(name, module)
            except CkptError:
                return stub_class(module, name)
        if module == "torch":
            try:
                return dtype_by_name(name)
            except CkptError:
                pass
        return stub_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise pickle.UnpicklingError(f"unsupported persistent id {type(pid).__name__}")
        # ("storage", storage_type, key, location, numel[, view_metadata]) -- FORMATS.md §2.2/§2.6
        storage_type, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        if not isinstance(storage_type, StorageType):
            raise pickle.UnpicklingError(f"unknown storage type {storage_type!r}")
        return StorageRef(key=str(key), dtype=storage_type.dtype, location=str(location), numel=int(numel),
                          storage_type=f"{storage_type.module}.{storage_type.class_name}")


def safe_loads(data: bytes, extra_globals: dict[tuple[str, str], Any] | None = None) -> Any:
    return SafeUnpickler(io.BytesIO(data), extra_globals).load()


def safe_load(file: IO[bytes], extra_globals: dict[tuple[str, str], Any] | None = None) -> Any:
    """Load one pickle from ``file``; the file position ends right after it."""
    return SafeUnpickler(file, extra_globals).load()


# --- turning stubs into browsable data ------------------------------------------------------------


def type_name(value: Any) -> str:
    """A short, stable type label for objects panels and ``--json``."""
    if isinstance(value, PickleStub):
        return type(value).qualname()
    if isinstance(value, TensorRef):
        return value.kind
    if isinstance(value, DType):
        return "torch.dtype"
    return type(value).__name__


def to_plain(value: Any, _depth: int = 0) -> Any:
    """Render unpickled data as JSON-like values: stubs become dicts tagged with ``__class__``."""
    if _depth > 50:
        return "..."
    if isinstance(value, PickleStub):
        cls = type(value).qualname()
        state = value.state
        # Enums pickle as ``Cls(value)``: show them as one readable string.
        if value.args and state is None and not value.items and not value.dict_items and len(value.args) == 1 \
                and isinstance(value.args[0], (int, str, float)):
            return f"{cls}({value.args[0]!r})"
        out: dict[str, Any] = {"__class__": cls}
        if value.args:
            out["__args__"] = [to_plain(a, _depth + 1) for a in value.args]
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict_state, slot_state)
        if isinstance(state, dict):
            out.update({str(k): to_plain(v, _depth + 1) for k, v in state.items()})
        elif state is not None:
            out["__state__"] = to_plain(state, _depth + 1)
        if value.items:
            out["__items__"] = [to_plain(v, _depth + 1) for v in value.items]
        out.update({str(k): to_plain(v, _depth + 1) for k, v in value.dict_items.items()})
        return out
    if isinstance(value, TensorRef):
        return f"<{value.kind} {value.dtype.name}{list(value.shape)}>"
    if isinstance(value, StorageRef):
        return f"<storage {value.key}>"
    if isinstance(value, DType):
        return f"torch.{value.name}"
    if isinstance(value, dict):
        return {str(k): to_plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v, _depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_plain(v, _depth + 1) for v in value), key=repr)
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
