"""ops.layout: shard-map geometry as data, on real files and on multi-chunk TensorMetas built here
(the shapes sharded readers produce: TP rows/cols, 2-D grids, stacked layers split by PP, holes,
replicas, thousands of chunks)."""

from __future__ import annotations

import itertools

import pytest

from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.formats import open_checkpoint
from ckptscope.ops.layout import allocate, file_colors, grid_size, shard_layout, split_counts


def grid_chunks(shape, splits, file_of=lambda k: f"rank_{k}.distcp"):
    """Chunks tiling ``shape`` with ``splits[i]`` equal pieces along axis i (C order of ranks)."""
    chunks = []
    for k, idx in enumerate(itertools.product(*(range(n) for n in splits))):
        offsets = tuple(size * i // n for size, i, n in zip(shape, idx, splits))
        stops = tuple(size * (i + 1) // n for size, i, n in zip(shape, idx, splits))
        local = tuple(b - a for a, b in zip(offsets, stops))
        chunks.append(Chunk(offsets, local, file_of(k), 0, 2 * (local[0] if local else 1)))
    return tuple(chunks)


def owner_at(layout, panel, row, col):
    """The chunk indices covering global element (row, col) according to the layout bands."""
    p = layout.panels[panel]
    i = next(i for i, s in enumerate(p.rows) if s.start <= row < s.stop)
    j = next(j for j, s in enumerate(p.cols) if s.start <= col < s.stop)
    return p.owners[i][j]


def truth(meta, index):
    return tuple(k for k, c in enumerate(meta.chunks)
                 if all(o <= x < o + s for x, o, s in zip(index, c.offsets, c.shape)))


def test_plain_file_single_block(samples):
    with open_checkpoint(samples["hf_llama_sharded"]) as reader:
        index = reader.index()
    for meta in index:
        layout = shard_layout(meta)
        assert layout.num_chunks == 1 and layout.files == meta.files
        assert len(layout.panels) == 1
        cells = [c for row in layout.panels[0].owners for c in row]
        assert cells and all(c == (0,) for c in cells)
        assert layout.stored_elems == meta.numel and not layout.splits and layout.holes == 0


@pytest.mark.parametrize("splits", [(4, 1), (1, 8), (2, 4), (3, 5)])
def test_2d_grid_owner_of_every_element(splits):
    shape = (1000, 300)
    meta = TensorMeta("w", "bfloat16", shape, grid_chunks(shape, splits))
    layout = shard_layout(meta, max_rows=12, max_cols=48)
    panel = layout.panels[0]
    assert not panel.sampled
    assert len(panel.rows) == splits[0] and len(panel.cols) == splits[1]
    assert sum(s.cells for s in panel.cols) <= 48 and sum(s.cells for s in panel.rows) <= 12
    for row, col in itertools.product(range(0, 1000, 37), range(0, 300, 13)):
        assert owner_at(layout, 0, row, col) == truth(meta, (row, col))
    assert layout.splits == {a: n for a, n in enumerate(splits) if n > 1}
    assert layout.stored_elems == meta.numel and not layout.replicated


def test_thin_chunk_still_gets_a_cell():
    shape = (10_000, 64)
    chunks = (Chunk((0, 0), (9_990, 64), "a"), Chunk((9_990, 0), (10, 64), "b"))
    layout = shard_layout(TensorMeta("w", "float32", shape, chunks), max_rows=8, max_cols=32)
    rows = layout.panels[0].rows
    assert [r.cells >= 1 for r in rows] == [True, True] and rows[1].start == 9_990
    assert sum(r.cells for r in rows) <= 8


def test_holes_and_replicas():
    shape = (100, 100)
    missing = TensorMeta("w", "float32", shape, (Chunk((0, 0), (50, 100), "r0"),))
    layout = shard_layout(missing)
    assert layout.holes > 0 and layout.stored_elems == 5000
    assert owner_at(layout, 0, 75, 10) == ()
    replicated = TensorMeta("w", "float32", shape, (Chunk((0, 0), (100, 100), "r0"), Chunk((0, 0), (100, 100), "r1")))
    layout = shard_layout(replicated)
    assert layout.replicated and owner_at(layout, 0, 3, 3) == (0, 1)


def test_3d_stacked_layers_split_by_pipeline_become_panels():
    shape = (32, 128, 64)  # 32 stacked layers, PP=4 on axis 0, TP=2 on axis 1
    meta = TensorMeta("decoder.layers.mlp.weight", "bfloat16", shape, grid_chunks(shape, (4, 2, 1)))
    layout = shard_layout(meta)
    assert layout.lead_axes == (0,) and layout.plane_axes == (1, 2)
    assert layout.total_panels == 4
    assert [p.lead for p in layout.panels] == [((0, 8),), ((8, 16),), ((16, 24),), ((24, 32),)]
    for p, panel in enumerate(layout.panels):
        assert len(panel.rows) == 2
        for layer in (panel.lead[0][0], panel.lead[0][1] - 1):
            for row, col in itertools.product(range(0, 128, 9), range(0, 64, 11)):
                assert owner_at(layout, p, row, col) == truth(meta, (layer, row, col))


def test_4d_experts_and_panel_cap():
    shape = (4, 16, 32, 32)  # layers x experts x rows x cols, one chunk per (layer, expert)
    meta = TensorMeta("experts", "float16", shape, grid_chunks(shape, (4, 16, 1, 1)))
    layout = shard_layout(meta, max_panels=10)
    assert layout.total_panels == 64 and len(layout.panels) == 10
    assert layout.panels[5].lead == ((0, 1), (5, 6))
    assert layout.panels[5].owners[0][0] == (5,)


def test_many_chunks_are_sampled_not_lost():
    shape = (8, 4096)
    meta = TensorMeta("w", "float32", shape, grid_chunks(shape, (1, 512)))  # 512 column shards
    layout = shard_layout(meta, max_cols=48)
    panel = layout.panels[0]
    assert panel.sampled and sum(c.cells for c in panel.cols) == 48
    covered = {k for row in panel.owners for cell in row for k in cell}
    assert covered == set(range(512))  # every chunk appears in some (mixed) cell


def test_vector_and_scalar():
    vec = TensorMeta("b", "float32", (100,), grid_chunks((100,), (4,)))
    layout = shard_layout(vec, max_cols=40)
    assert layout.plane_axes == (0,) and len(layout.panels[0].rows) == 1
    assert [owner_at(layout, 0, 0, x) for x in (0, 30, 60, 99)] == [(0,), (1,), (2,), (3,)]
    scalar = TensorMeta("s", "float32", (), (Chunk((), (), "f"),))
    assert shard_layout(scalar).panels[0].owners == (((0,),),)


def test_file_colours_follow_natural_order():
    chunks = tuple(Chunk((i,), (1,), f"rank_{r}.pt") for i, r in enumerate([10, 2, 1, 2]))
    assert file_colors(chunks) == {"rank_1.pt": 0, "rank_2.pt": 1, "rank_10.pt": 2}
    assert split_counts(TensorMeta("x", "float32", (4,), chunks)) == {0: 4}


def test_allocate_and_grid_size():
    spans, sampled = allocate([(0, 10), (10, 1000)], 20)
    assert not sampled and spans[0].cells == 1 and sum(s.cells for s in spans) == 20
    assert grid_size((256, 64), max_rows=12, max_cols=48) == (12, 32)  # tall: keep it readable
    assert grid_size((64, 256), max_rows=12, max_cols=48) == (6, 48)
