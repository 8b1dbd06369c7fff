"""The one dtype table agrees with torch, safetensors and numpy."""

import numpy as np
import pytest
import torch
from safetensors.torch import _TYPES as SAFETENSORS_TORCH_TYPES  # the binding's own code -> dtype map

from ckptscope.core.dtypes import all_dtypes, dtype_by_name, dtype_by_safetensors, dtype_by_storage_class
from ckptscope.core.errors import CkptError

TORCH_DTYPES = [d for d in all_dtypes() if hasattr(torch, d.name) and d.name != "complex32"]


@pytest.mark.parametrize("dt", TORCH_DTYPES, ids=lambda d: d.name)
def test_itemsize_matches_torch(dt):
    assert torch.empty(0, dtype=getattr(torch, dt.name)).element_size() * 8 == dt.bits


@pytest.mark.parametrize("code,torch_dtype", sorted(SAFETENSORS_TORCH_TYPES.items(), key=lambda kv: kv[0]))
def test_safetensors_codes_match_the_binding(code, torch_dtype):
    assert dtype_by_safetensors(code).name == str(torch_dtype).removeprefix("torch.")


@pytest.mark.parametrize("dt", [d for d in TORCH_DTYPES if d.numpy_name], ids=lambda d: d.name)
def test_numpy_view_has_the_same_itemsize(dt):
    assert dt.numpy().itemsize == dt.itemsize


def test_bfloat16_bytes_decode_like_torch():
    values = torch.tensor([1.5, -2.25, 3.0e38, 1e-3]).bfloat16()
    raw = values.view(torch.int16).numpy().tobytes()
    decoded = np.frombuffer(raw, dtype=dtype_by_name("bfloat16").numpy()).astype(np.float32)
    assert decoded.tolist() == values.float().tolist()


def test_storage_classes_and_aliases():
    assert dtype_by_storage_class("BFloat16Storage").name == "bfloat16"
    assert dtype_by_storage_class("UntypedStorage").name == "uint8"
    assert dtype_by_name("torch.float").name == "float32"
    with pytest.raises(CkptError):
        dtype_by_name("float7")
    with pytest.raises(CkptError):
        dtype_by_safetensors("F7")
