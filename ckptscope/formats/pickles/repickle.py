"""Pickle a safely-parsed object tree back, with the globals and opcodes it was read with.

The tree from the stub unpickler (dicts, ``TensorRef``s, stubs) is written again as torch would
write it: stubs remember their module, name, constructor arguments and state, and tensors become
``torch._utils._rebuild_tensor_v2`` calls on persistent storage ids. This is how a file is
rewritten without trusting it (rename), and how writers emit torch pickles without importing
torch (``common.pt``, ``.metadata``, ``_extra_state``).
"""

from __future__ import annotations

import collections
import io
import pickle
import sys
from typing import Any, BinaryIO

from ckptscope.core.dtypes import DType
from ckptscope.core.errors import CkptError
from ckptscope.formats.pickles.safe import PickleStub, StorageRef, TensorRef


class GlobalRef:
    """A module-level name to write as a pickle GLOBAL without importing it."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


_REBUILD_V2 = GlobalRef("torch._utils", "_rebuild_tensor_v2")
_REBUILD_V3 = GlobalRef("torch._utils", "_rebuild_tensor_v3")
_REBUILD_PARAMETER = GlobalRef("torch._utils", "_rebuild_parameter")


class _RePickler(pickle._Pickler):  # the pure-Python pickler lets us intercept every object
    def __init__(self, file: BinaryIO, *, legacy: bool, protocol: int = 2) -> None:
        super().__init__(file, protocol=protocol)
        self._legacy = legacy
        self.storages: dict[str, StorageRef] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, StorageRef):
            self.storages.setdefault(obj.key, obj)
            module, _, name = obj.storage_type.rpartition(".")
            pid = ("storage", GlobalRef(module, name), obj.key, obj.location, obj.numel)
            return (*pid, None) if self._legacy else pid
        return None

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, (GlobalRef, DType)) or (isinstance(obj, type) and issubclass(obj, PickleStub)):
            self._save_global_ref(obj)
        elif isinstance(obj, TensorRef):
            self._save_tensor(obj)
        elif isinstance(obj, PickleStub):
            self._save_stub(obj)
        else:
            super().save(obj, save_persistent_id)

    def _memo_hit(self, obj: Any) -> bool:
        entry = self.memo.get(id(obj))
        if entry is not None:
            self.write(self.get(entry[0]))
            return True
        return False

    def _save_global_ref(self, obj: Any) -> None:
        if self._memo_hit(obj):
            return
        if isinstance(obj, DType):
            module, name = "torch", obj.name
        elif isinstance(obj, GlobalRef):
            module, name = obj.module, obj.name
        else:
            module, name = obj.stub_module, obj.stub_name
        if self.proto >= 4:
            # What pickle itself writes from protocol 4 on (torch's DCP ``.metadata`` is protocol 4):
            # the names as memoised strings, then STACK_GLOBAL. Interned, so that equal names read
            # from different pickles share one memo entry, as one module's classes do in pickle.
            self.save(sys.intern(module))
            self.save(sys.intern(name))
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + module.encode("utf-8") + b"\n" + name.encode("utf-8") + b"\n")
        self.memoize(obj)

    def _save_tensor(self, ref: TensorRef) -> None:
        if self._memo_hit(ref):
            return
        if ref.kind not in ("Tensor", "Parameter") or ref.storage is None:
            raise CkptError(f"cannot re-write a {ref.kind} tensor (tensor subclasses are not supported)")
        if ref.kind == "Parameter":
            self.save(_REBUILD_PARAMETER)
            self.write(pickle.MARK)
            self._save_plain_tensor(ref)
            self.save(ref.requires_grad)
            self.save(collections.OrderedDict())
            self.write(pickle.TUPLE + pickle.REDUCE)
        else:
            self._save_plain_tensor(ref)
        self.memoize(ref)

    def _save_plain_tensor(self, ref: TensorRef) -> None:
        untyped = ref.storage is not None and ref.storage.storage_type.endswith("UntypedStorage")
        self.save(_REBUILD_V3 if untyped else _REBUILD_V2)
        args: tuple[Any, ...] = (ref.storage, ref.storage_offset, tuple(ref.shape), tuple(ref.stride),
                                 ref.requires_grad, collections.OrderedDict())
        if untyped:
            args += (ref.dtype,)
        self.save(args)
        self.write(pickle.REDUCE)

    def _save_stub(self, stub: PickleStub) -> None:
        if self._memo_hit(stub):
            return
        if stub.kwargs:
            raise CkptError(f"cannot re-write {type(stub).qualname()} (keyword construction)")
        self.save(type(stub))
        self.save(tuple(stub.args))
        self.write(pickle.REDUCE if stub.called else pickle.NEWOBJ)
        self.memoize(stub)
        if stub.items:
            self.write(pickle.MARK)
            for item in stub.items:
                self.save(item)
            self.write(pickle.APPENDS)
        if stub.dict_items:
            self.write(pickle.MARK)
            for key, value in stub.dict_items.items():
                self.save(key)
                self.save(value)
            self.write(pickle.SETITEMS)
        if stub.state is not None:
            self.save(stub.state)
            self.write(pickle.BUILD)


def repickle(obj: Any, *, legacy: bool = False, protocol: int = 2) -> tuple[bytes, dict[str, StorageRef]]:
    """Pickle ``obj`` as torch would; returns the bytes and the storages it refers to.

    ``protocol`` is 2 for ``torch.save`` data (what torch writes there); plain pickles such as a
    DCP ``.metadata`` (``pickle.dump`` with Python's default, 4) ask for theirs. Nothing in here
    imports torch, so a tree without tensors can be written back without it.
    """
    buf = io.BytesIO()
    pickler = _RePickler(buf, legacy=legacy, protocol=protocol)
    pickler.dump(obj)
    return buf.getvalue(), pickler.storages
