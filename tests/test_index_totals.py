"""Index totals and the collector pause that indexing runs under."""

import gc
import threading

from ckptscope.core.collector import collector_paused
from ckptscope.core.index import CheckpointIndex
from ckptscope.core.tensor import TensorMeta
from ckptscope.formats import open_checkpoint


def test_bytes_per_dtype_equals_the_per_tensor_sum_even_for_packed_dtypes():
    tensors = {t.name: t for t in (
        TensorMeta("a", "bfloat16", (3, 5)), TensorMeta("b", "bfloat16", (7,)),
        TensorMeta("c", "float4_e2m1fn", (3,)), TensorMeta("d", "float4_e2m1fn", (5,)),  # 2 + 3 bytes, not 4
        TensorMeta("e", "float32", ()),
    )}
    index = CheckpointIndex(path="x", format="test", tensors=tensors)
    expected = {}
    for t in tensors.values():
        expected[t.dtype] = expected.get(t.dtype, 0) + t.nbytes
    assert index.bytes_per_dtype() == expected
    assert list(index.bytes_per_dtype()) == ["bfloat16", "float4_e2m1fn", "float32"]  # largest first
    assert index.total_bytes == sum(expected.values()) == 2 * 22 + 5 + 4


def test_collector_pause_nests_and_restores_the_previous_state():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a program that turned it off keeps it off
    finally:
        gc.enable()


def test_concurrent_pauses_end_with_the_last_one():
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread is still indexing
    release.set()
    thread.join()
    assert gc.isenabled()


def test_indexing_a_real_checkpoint_leaves_the_collector_on(samples):
    reader = open_checkpoint(samples["hf_llama_sharded"])
    assert len(reader.index()) > 0
    assert gc.isenabled()
