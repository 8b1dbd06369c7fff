"""The safe unpickler never runs code from a pickle, yet keeps what users need to see."""

from __future__ import annotations

import argparse
import io
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from ckptscope.formats import open_checkpoint
from ckptscope.formats.pickles.safe import PickleStub, TensorRef, safe_loads, to_plain


class _Payload:
    """Pickles as a call that would create ``target`` if it were ever executed."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class _EvalPayload:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (eval, (f"open({str(self.target)!r}, 'w').write('pwned')",))


class _SubprocessPayload:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.target)],))


@pytest.mark.parametrize("payload_cls", [_Payload, _EvalPayload, _SubprocessPayload])
def test_malicious_reduce_never_executes_in_plain_pickle(tmp_path, payload_cls):
    target = tmp_path / "pwned"
    data = pickle.dumps({"weights": [1, 2], "evil": payload_cls(target)}, protocol=2)
    value = safe_loads(data)
    assert not target.exists()
    assert isinstance(value["evil"], PickleStub)
    assert value["weights"] == [1, 2]


@pytest.mark.parametrize("payload_cls", [_Payload, _EvalPayload, _SubprocessPayload])
def test_malicious_torch_file_is_inspected_without_executing(tmp_path, payload_cls, cli):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(3), "evil": payload_cls(target)}, path)
    assert not target.exists()
    result = cli("inspect", "--json", str(path))
    assert result.code == 0, result.err
    assert not target.exists(), "the payload ran"
    assert '"name": "w"' in result.out
    # And through the Python API, reading the tensor too.
    reader = open_checkpoint(path)
    assert reader.read("w").tolist() == [1.0, 1.0, 1.0]
    evil = next(o for o in reader.index().objects if o.name == "evil")
    assert evil.type.endswith(".system") or evil.type.endswith(".eval") or evil.type.endswith(".call")
    assert not target.exists()


def test_malicious_legacy_torch_file_never_executes(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil_legacy.pt"
    torch.save({"w": torch.ones(2), "evil": _Payload(target)}, path, _use_new_zipfile_serialization=False)
    index = open_checkpoint(path).index()
    assert "w" in index.tensors
    assert not target.exists()


def test_trust_pickle_really_runs_torch_load(tmp_path):
    """The explicit opt-in does execute the pickle (that is the point of the flag)."""
    target = tmp_path / "ran"
    path = tmp_path / "trusted.pt"
    torch.save({"w": torch.arange(4.0), "evil": _Payload(target)}, path)
    reader = open_checkpoint(path, trust_pickle=True)
    assert reader.read("w").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert target.exists()
    assert any("trust-pickle" in w for w in reader.index().warnings)


def test_namespace_args_are_browsable_as_a_dict():
    args = argparse.Namespace(num_layers=32, lr=3e-4, tensor_model_parallel_size=8, name="run-1")
    value = to_plain(safe_loads(pickle.dumps({"args": args}, protocol=2)))
    assert value["args"] == {"__class__": "argparse.Namespace", "num_layers": 32, "lr": 3e-4,
                             "tensor_model_parallel_size": 8, "name": "run-1"}


def test_tensor_refs_record_storage_view_and_dtype():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    buf = io.BytesIO()
    torch.save({"view": base[1:, 2:].t(), "param": torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16)),
                "f8": torch.zeros(3, dtype=torch.float8_e5m2)}, buf)
    with zipfile.ZipFile(buf) as archive:
        pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        obj = safe_loads(archive.read(pkl))
    view = obj["view"]
    assert isinstance(view, TensorRef)
    assert view.shape == (4, 3) and view.stride == (1, 6) and view.storage_offset == 8
    assert not view.is_contiguous
    assert obj["param"].kind == "Parameter" and obj["param"].dtype.name == "bfloat16"
    assert obj["f8"].dtype.name == "float8_e5m2" and obj["f8"].storage.dtype.name == "uint8"
