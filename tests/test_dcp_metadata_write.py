"""The torch-free ``.metadata`` writer against torch's own classes pickled by ``pickle.dump``.

The reference is built by ``TorchMetadata`` below (torch's dataclasses, torch's pickle, as
megatron-core's one-rank save writes it) from the same items; both pickles are loaded with plain ``pickle.loads`` under torch and compared field
by field, and both are read by ckptscope's own torch-free parser.
"""

from __future__ import annotations

import pickle
import pickletools
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint import planner as dcp_planner

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.formats.dcp.metadata import field_of, load_dcp_metadata
from ckptscope.formats.dcp.metadata_write import BytesItem, ChunkItem, metadata_bytes

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT_ID = "/ckpts/run/iter_0000010"
L = 3


class _Files:
    """Byte ranges as a writer appending to ``__0_{k}.distcp`` hands them out."""

    def __init__(self, count: int = 2) -> None:
        self.sizes = [0] * count

    def place(self, k: int, length: int) -> tuple[str, int, int]:
        offset = self.sizes[k]
        self.sizes[k] += length
        return f"__0_{k}.distcp", offset, length


def _chunk(files: _Files, k: int, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...],
           shape: tuple[int, ...], dtype: str) -> ChunkItem:
    numel = 1
    for s in sizes:
        numel *= s
    return ChunkItem(key, offsets, sizes, shape, dtype, *files.place(k, 1100 + numel * dtype_by_name(dtype).itemsize))


def realistic_items() -> list[ChunkItem | BytesItem]:
    """Several keys; stacked per-layer keys (one chunk per layer at (l, 0, ...)); SwiGLU fc1 halves; 1-D
    float32 norms next to bf16 weights; two files; ShardedObject bytes items before and between chunks."""
    files = _Files()
    items: list[ChunkItem | BytesItem] = []
    extra = "decoder.layers.self_attention.linear_proj._extra_state/shard_{l}_" + str(L)
    for layer in range(2):
        items.append(BytesItem(extra.format(l=layer), *files.place(layer % 2, 433)))
    items.append(_chunk(files, 0, "embedding.word_embeddings.weight", (0, 0), (32, 16), (32, 16), "bfloat16"))
    for layer in range(L):
        items.append(_chunk(files, layer % 2, "decoder.layers.self_attention.linear_qkv.weight",
                            (layer, 0, 0), (1, 48, 16), (L, 48, 16), "bfloat16"))
        items.append(_chunk(files, 1, "decoder.layers.input_layernorm.weight", (layer, 0), (1, 16), (L, 16), "float32"))
    items.append(BytesItem(extra.format(l=2), *files.place(0, 433)))
    items.append(BytesItem("decoder.layers.mlp.linear_fc1._extra_state/shard_0_3", *files.place(1, 433)))
    for layer in range(L):
        for half in range(2):  # gate rows [0, 32), up rows [32, 64)
            items.append(_chunk(files, (layer + half) % 2, "decoder.layers.mlp.linear_fc1.weight",
                                (layer, 32 * half, 0), (1, 32, 16), (L, 64, 16), "bfloat16"))
    items.append(_chunk(files, 0, "decoder.final_layernorm.weight", (0,), (16,), (16,), "float32"))
    return items


def edge_items() -> list[ChunkItem | BytesItem]:
    """What the realistic list does not reach: a scalar, a 5-D chunk, a key over 255 bytes, byte offsets
    past 4 GiB, enough chunks for several pickle frames and memo indexes past 255, other dtypes."""
    files = _Files(3)
    files.sizes[2] = 5 << 30
    items: list[ChunkItem | BytesItem] = [
        _chunk(files, 2, "scalar", (), (), (), "int64"),
        _chunk(files, 2, "five_d", (0, 1, 0, 0, 0), (2, 1, 3, 4, 5), (2, 2, 3, 4, 5), "float16"),
        _chunk(files, 2, "a.very." + "long." * 60 + "key", (0,), (4,), (4,), "float8_e4m3fn"),
        BytesItem("b" * 300 + "/shard_0_1", *files.place(2, 12)),
    ]
    items += [_chunk(files, n % 2, "experts.weight", (n // 4, n % 4, 0), (1, 1, 8), (100, 4, 8), "bfloat16")
              for n in range(400)]
    return items


class TorchMetadata:
    """The oracle: ``.metadata`` built with torch's own DCP classes and pickled by ``pickle.dump``,
    the way megatron-core's one-rank save does (planner_data None, Megatron's all_local_plans)."""

    def __init__(self) -> None:
        from torch.distributed.checkpoint import filesystem, metadata, planner

        self.md, self.fs, self.planner = metadata, filesystem, planner
        self.state: dict = {}
        self.storage: dict = {}
        self.items: list = []

    def add_bytes(self, key: str, file: str, offset: int, length: int) -> None:
        index = self.md.MetadataIndex(key)
        self.storage[index] = self.fs._StorageInfo(file, offset, length)
        self.state[key] = self.md.BytesStorageMetadata()
        self.items.append(self.planner.WriteItem(index=index, type=self.planner.WriteItemType.BYTE_IO))

    def add_chunk(self, item: ChunkItem) -> None:
        md = self.md
        index = md.MetadataIndex(item.key, item.offsets)
        self.storage[index] = self.fs._StorageInfo(item.file, item.offset, item.length)
        properties = md.TensorProperties(dtype=getattr(torch, item.dtype))
        entry = self.state.get(item.key)
        if entry is None:
            entry = self.state[item.key] = md.TensorStorageMetadata(properties, torch.Size(item.global_shape), [])
        placement = md.ChunkStorageMetadata(torch.Size(item.offsets), torch.Size(item.sizes))
        entry.chunks.append(placement)
        self.items.append(self.planner.WriteItem(
            index=index, type=self.planner.WriteItemType.SHARD,
            tensor_data=self.planner.TensorWriteData(chunk=placement, properties=properties,
                                                     size=torch.Size(item.global_shape))))

    def dump(self, path: Path, checkpoint_id: str) -> None:
        metadata = self.md.Metadata(
            state_dict_metadata=self.state, planner_data=None, storage_data=self.storage,
            storage_meta=self.md.StorageMeta(checkpoint_id=checkpoint_id, save_id=str(uuid.uuid4())),
            version="1.0.0")
        metadata.all_local_plans = [self.planner.SavePlan(items=self.items, planner_data={})]
        with open(path, "wb") as handle:
            pickle.dump(metadata, handle)


def _reference_bytes(items: list[ChunkItem | BytesItem], tmp_path: Path) -> bytes:
    """torch's pickle of the same items, built with torch's classes (``TorchMetadata``)."""
    meta = TorchMetadata()
    for item in items:
        if isinstance(item, BytesItem):
            meta.add_bytes(item.key, item.file, item.offset, item.length)
        else:
            meta.add_chunk(item)
    path = tmp_path / ".metadata"
    meta.dump(path, CHECKPOINT_ID)
    return path.read_bytes()


def _index(index: dcp_md.MetadataIndex) -> tuple:
    """Everything a MetadataIndex holds (its ``__eq__`` leaves ``index`` out), with the offset's type."""
    return list(vars(index).items()), type(index.offset), index.index


def _tree(obj):
    """The whole unpickled graph as plain data: every object's type and instance dict, recursively."""
    if isinstance(obj, dict):
        return [(_tree(k), _tree(v)) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return type(obj), [_tree(v) for v in obj]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return type(obj), _tree(vars(obj))
    return type(obj), obj


def _assert_same(mine: dcp_md.Metadata, ref: dcp_md.Metadata) -> None:
    assert type(mine) is type(ref) is dcp_md.Metadata
    assert list(vars(mine)) == list(vars(ref))  # the fields, then Megatron's all_local_plans
    assert list(mine.state_dict_metadata) == list(ref.state_dict_metadata)
    for key, entry in ref.state_dict_metadata.items():
        got = mine.state_dict_metadata[key]
        assert type(got) is type(entry), key
        if isinstance(entry, dcp_md.TensorStorageMetadata):
            assert vars(got.properties) == vars(entry.properties), key  # dtype, layout, memory_format, ...
            assert type(got.size) is torch.Size and got.size == entry.size, key
            assert [(type(c.offsets), c.offsets, type(c.sizes), c.sizes) for c in got.chunks] == \
                   [(type(c.offsets), c.offsets, type(c.sizes), c.sizes) for c in entry.chunks], key
    assert [_index(k) for k in mine.storage_data] == [_index(k) for k in ref.storage_data]
    assert list(mine.storage_data.values()) == list(ref.storage_data.values())
    assert [vars(v) for v in mine.storage_data.values()] == [vars(v) for v in ref.storage_data.values()]
    assert vars(mine.storage_meta) == vars(ref.storage_meta)
    assert mine.planner_data is None and ref.planner_data is None
    assert mine.version == ref.version
    assert len(mine.all_local_plans) == len(ref.all_local_plans) == 1
    got_plan, ref_plan = mine.all_local_plans[0], ref.all_local_plans[0]
    assert type(got_plan) is dcp_planner.SavePlan
    assert (got_plan.storage_data, got_plan.planner_data, got_plan.usable) == \
           (ref_plan.storage_data, ref_plan.planner_data, ref_plan.usable)
    assert got_plan.items == ref_plan.items
    assert [_index(w.index) for w in got_plan.items] == [_index(w.index) for w in ref_plan.items]
    assert [w.type for w in got_plan.items] == [w.type for w in ref_plan.items]
    assert [w.tensor_data and vars(w.tensor_data.properties) for w in got_plan.items] == \
           [w.tensor_data and vars(w.tensor_data.properties) for w in ref_plan.items]
    assert mine == ref  # dataclass equality over all fields
    assert _tree(mine) == _tree(ref)  # and every instance dict, types included, down to the leaves


def _shared(meta: dcp_md.Metadata) -> tuple[bool, bool, bool]:
    """Whether the objects torch shares are shared: index keys, chunk placements, first-chunk properties."""
    items = meta.all_local_plans[0].items
    indexes = all(a is b for a, b in zip(meta.storage_data, (w.index for w in items)))
    tensors = [w.tensor_data for w in items if w.tensor_data is not None]
    chunks = {id(c) for e in meta.state_dict_metadata.values() if hasattr(e, "chunks") for c in e.chunks}
    placements = all(id(t.chunk) in chunks for t in tensors)
    properties = {id(e.properties) for e in meta.state_dict_metadata.values() if hasattr(e, "properties")}
    first_chunks = sum(id(t.properties) in properties for t in tensors)
    return indexes, placements, first_chunks == len(properties)


@pytest.mark.parametrize("make_items", [realistic_items, edge_items])
def test_unpickles_equal_to_torch_own_pickle(make_items, tmp_path):
    items = make_items()
    ref_bytes = _reference_bytes(items, tmp_path)
    ref = pickle.loads(ref_bytes)
    mine_bytes = metadata_bytes(items, checkpoint_id=CHECKPOINT_ID, save_id=ref.storage_meta.save_id)
    mine = pickle.loads(mine_bytes)
    _assert_same(mine, ref)
    assert _shared(mine) == _shared(ref) == (True, True, True)
    assert mine_bytes[:2] == ref_bytes[:2] == b"\x80\x04"  # the protocol torch's pickle.dump used


def test_edge_items_reach_frames_and_long_memo_gets():
    """The edge list does exercise several frames and LONG_BINGET (not only the one-frame path)."""
    ops = [op.name for op, _, _ in pickletools.genops(metadata_bytes(edge_items(), checkpoint_id="x", save_id="y"))]
    assert ops.count("FRAME") > 1 and "LONG_BINGET" in ops and "BINUNICODE" in ops and "LONG1" in ops


def test_writer_never_imports_torch_or_numpy():
    code = (
        "import sys\n"
        "from ckptscope.formats.dcp.metadata_write import BytesItem, ChunkItem, metadata_bytes\n"
        "data = metadata_bytes([ChunkItem('w', (0, 0), (2, 3), (4, 3), 'bfloat16', '__0_0.distcp', 0, 99),\n"
        "                       BytesItem('x/shard_0_1', '__0_1.distcp', 0, 7)], checkpoint_id='c', save_id='s')\n"
        "assert data.startswith(b'\\x80\\x04'), data[:2]\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def _plans(meta) -> list[tuple]:
    items = field_of(meta.extra["all_local_plans"][0], "items")
    return [(field_of(field_of(w, "index"), "fqn"), field_of(field_of(w, "index"), "offset"),
             field_of(field_of(w, "type"), "args")) for w in items]


@pytest.mark.parametrize("make_items", [realistic_items, edge_items])
def test_ckptscope_parser_reads_it_as_torch_pickle(make_items, tmp_path):
    items = make_items()
    ref_bytes = _reference_bytes(items, tmp_path)
    save_id = pickle.loads(ref_bytes).storage_meta.save_id
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / ".metadata").write_bytes(metadata_bytes(items, checkpoint_id=CHECKPOINT_ID, save_id=save_id))
    ref, mine = load_dcp_metadata(tmp_path / ".metadata"), load_dcp_metadata(tmp_path / "mine" / ".metadata")
    assert list(mine.tensors) == list(ref.tensors) and mine.tensors == ref.tensors
    assert mine.bytes_entries == ref.bytes_entries
    assert (mine.planner_data, mine.version, mine.storage_meta, mine.class_name) == \
           (ref.planner_data, ref.version, ref.storage_meta, ref.class_name)
    assert list(mine.extra) == list(ref.extra) == ["all_local_plans"]
    assert _plans(mine) == _plans(ref)
    chunk_keys = {i.key for i in items if isinstance(i, ChunkItem)}
    assert set(mine.tensors) == chunk_keys and all(c.storage for t in mine.tensors.values() for c in t.chunks)


@pytest.mark.parametrize("items, problem", [
    ([ChunkItem("w", (0,), (2,), (4,), "bfloat16", "a", 0, 1), ChunkItem("w", (2,), (2,), (4,), "float32", "a", 1, 1)],
     "disagree"),
    ([ChunkItem("w", (0,), (2,), (4,), "bfloat16", "a", 0, 1), ChunkItem("w", (0,), (2,), (4,), "bfloat16", "a", 1, 1)],
     "written twice"),
    ([BytesItem("w", "a", 0, 1), ChunkItem("w", (0,), (2,), (4,), "bfloat16", "a", 1, 1)], "bytes item"),
    ([ChunkItem("w", (3,), (2,), (4,), "bfloat16", "a", 0, 1)], "does not fit"),
    ([ChunkItem("w", (0,), (2,), (4,), "float4_e2m1fn", "a", 0, 1)], "no dtype"),
    ([BytesItem("w", "../a", 0, 1)], "bad DCP storage"),
])
def test_inconsistent_items_are_refused(items, problem):
    with pytest.raises(CkptError, match=problem):
        metadata_bytes(items, checkpoint_id="c", save_id="s")
