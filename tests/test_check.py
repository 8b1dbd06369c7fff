"""``ckptscope check``: real checkpoints (written by the real writers), then really damaged.

Damage is done the way it happens: a file cut short, a rank file or marker deleted, an index
edited by hand. What each problem must name (files, tensors, byte counts) is computed from the
writers' own metadata (torch's DCP reader, the safetensors header bytes, the HF index JSON), not
from ckptscope. Overlaps and holes cannot be produced by a real writer, so the coverage function
is tested directly on ``Chunk`` boxes against a brute-force count.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dist_reference import MEGATRON_ITER, SAMPLES, generators

from ckptscope.core.index import CheckpointIndex
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.ops.check import (
    byte_length_problems,
    check_checkpoint,
    check_index,
    chunk_coverage,
    coverage_problems,
    union_volume,
)

FSDP2 = SAMPLES / "dcp_fsdp2"
MEGATRON_ROOT = SAMPLES / "megatron_torch_dist"
TRACKER = "latest_checkpointed_iteration.txt"


# --- ground truth from the writers' own formats ------------------------------------------------


def dcp_storage(path: Path) -> list[tuple[str, str, int]]:
    """``(fqn, file, end byte)`` of every item in a DCP ``.metadata``, read by torch itself."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(path)).read_metadata()
    tensors = {k for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    return [(index.fqn, info.relative_path, info.offset + info.length)
            for index, info in md.storage_data.items() if index.fqn in tensors]


def safetensors_spans(path: Path) -> dict[str, int]:
    """Tensor name -> absolute end byte, from the raw header (8-byte length + JSON)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    header.pop("__metadata__", None)
    return {name: 8 + length + entry["data_offsets"][1] for name, entry in header.items()}


def copy(src: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    target = tmp_path / name
    shutil.copytree(src, target)
    return target


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def problem_lines(result) -> list[str]:
    """Problem lines of the human output (the first stdout line names the layout, the last one is the summary)."""
    lines = result.out.strip().splitlines()
    return lines[1:-1]


def check_json(cli, path: Path) -> tuple[int, dict]:
    result = cli("check", str(path), "--json")
    assert result.out.count("\n") == 1, result.out  # exactly one JSON object
    return result.code, json.loads(result.out)


def by_kind(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in doc["problems"]:
        out.setdefault(p["kind"], []).append(p)
    return out


# --- clean checkpoints -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dcp")
    gen = generators()
    return {"nested": gen.write_dcp_nested(out), "safetensors": gen.write_dcp_safetensors(out)}


def test_every_clean_sample_passes(samples, single_process):
    paths = [*samples.values(), *single_process.values(), FSDP2, MEGATRON_ROOT, MEGATRON_ITER]
    for path in paths:
        report = check_checkpoint(path)
        assert report.ok, (path, [p.line() for p in report.problems])
        assert report.tensors > 0 and report.chunks >= report.tensors and report.files >= 1


def test_clean_cli_exit_0_and_json_schema(cli):
    result = cli("check", str(FSDP2))
    assert result.code == 0, result
    assert result.out.strip().splitlines() == ["PyTorch DCP dir", "ok: 17 tensors, 29 chunks, 3 files checked"]
    code, doc = check_json(cli, FSDP2)
    assert code == 0
    assert set(doc) == {"path", "layout", "format", "ok", "iteration", "target", "problems", "checked"}
    assert doc["layout"] == "PyTorch DCP dir" and doc["iteration"] is None and doc["target"] is None
    assert doc["path"] == str(FSDP2) and doc["format"] == "dcp" and doc["ok"] is True and doc["problems"] == []
    expected_chunks = len(dcp_storage(FSDP2))  # torch's own count of tensor chunks
    assert doc["checked"] == {"tensors": 17, "files": 3, "chunks": expected_chunks}


def test_save_root_checks_the_tracked_iteration(cli):
    result = cli("check", str(MEGATRON_ROOT))
    assert result.code == 0, result
    assert result.out.splitlines()[0] == ("Megatron-LM save root (torch_dist, tracker: iteration 10): "
                                          "checking iteration 10 (iter_0000010)")
    code, doc = check_json(cli, MEGATRON_ROOT)
    assert code == 0 and doc["format"] == "megatron_dist" and doc["path"] == str(MEGATRON_ROOT)
    assert doc["layout"] == "Megatron-LM save root (torch_dist, tracker: iteration 10)"
    assert (doc["iteration"], doc["target"]) == (10, "iter_0000010")


def test_check_imports_no_torch():
    code = ("import sys; from ckptscope.ops.check import check_checkpoint\n"
            f"r = check_checkpoint({str(MEGATRON_ROOT)!r}); assert r.ok\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- damaged DCP --------------------------------------------------------------------------------


def test_truncated_distcp(tmp_path, cli):
    path = copy(FSDP2, tmp_path)
    victim = "__1_0.distcp"
    size = (path / victim).stat().st_size // 2
    truncate(path / victim, size)
    items = dcp_storage(FSDP2)
    need = max(end for _, f, end in items if f == victim)
    cut = {fqn for fqn, f, end in items if f == victim and end > size}
    assert cut

    code, doc = check_json(cli, path)
    assert code == 1 and doc["ok"] is False
    [problem] = doc["problems"]
    assert problem["kind"] == "truncated" and problem["file"] == victim
    assert set(problem["tensor"].split(", ")) == cut
    assert f"has {size:,} bytes" in problem["detail"] and f"need {need:,}" in problem["detail"]

    human = cli("check", str(path))
    assert human.code == 1
    [line] = problem_lines(human)
    assert line.startswith(f"truncated: {victim} [") and f"{size:,}" in line and f"{need:,}" in line
    assert human.out.strip().splitlines()[-1].startswith("1 problem in 17 tensors")

    inspected = cli("inspect", str(path))  # still readable, with a warning
    assert inspected.code == 0 and f"{victim}: truncated" in inspected.err


def test_a_model_dir_whose_only_shard_is_cut_says_nothing_could_be_read(samples, tmp_path, cli):
    """The summary read "1 problem in 0 tensors, 0 chunks, 0 files" (a probe): as if nothing had been checked."""
    folder = tmp_path / "model"
    folder.mkdir()
    whole = (samples["hf_llama_single"] / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(whole[:1000])
    result = cli("check", str(folder))
    assert result.code == 1 and "unreadable-file: model.safetensors: truncated" in result.out
    assert result.out.strip().splitlines()[-1] == "1 problem: nothing in it could be read"


def test_deleted_rank_file(tmp_path, cli):
    path = copy(FSDP2, tmp_path)
    victim = "__0_0.distcp"
    (path / victim).unlink()
    held = {fqn for fqn, f, _ in dcp_storage(FSDP2) if f == victim}
    code, doc = check_json(cli, path)
    assert code == 1
    [problem] = doc["problems"]
    assert problem["kind"] == "missing-file" and problem["file"] == victim
    assert set(problem["tensor"].split(", ")) == held
    assert f"{len(held)} tensors" in problem["detail"]


def test_deleted_dot_metadata_is_still_dcp(tmp_path, cli):
    path = copy(FSDP2, tmp_path)
    (path / ".metadata").unlink()
    code, doc = check_json(cli, path)
    assert code == 1 and doc["format"] == "dcp"
    assert [(p["kind"], p["file"]) for p in doc["problems"]] == [("missing-marker", ".metadata")]
    assert doc["checked"]["tensors"] == 0
    inspected = cli("inspect", str(path))
    assert inspected.code == 0 and "dcp" in inspected.out and ".metadata: not found" in inspected.err


# --- damaged Megatron torch_dist -----------------------------------------------------------------


def test_megatron_missing_metadata_json(tmp_path, cli):
    root = copy(MEGATRON_ROOT, tmp_path)
    (root / "iter_0000010" / "metadata.json").unlink()
    code, doc = check_json(cli, root)
    assert code == 1 and doc["format"] == "dcp"  # without its marker it is plain DCP
    assert [(p["kind"], p["file"]) for p in doc["problems"]] == [("missing-marker", "iter_0000010/metadata.json")]


def test_megatron_missing_dot_metadata(tmp_path, cli):
    root = copy(MEGATRON_ROOT, tmp_path)
    (root / "iter_0000010" / ".metadata").unlink()
    code, doc = check_json(cli, root / "iter_0000010")
    assert code == 1 and doc["format"] == "megatron_dist"
    assert [(p["kind"], p["file"]) for p in doc["problems"]] == [("missing-marker", ".metadata")]
    inspected = cli("inspect", str(root / "iter_0000010"))
    assert inspected.code == 0 and "args" in inspected.out  # common.pt is still shown
    assert ".metadata: not found" in inspected.err


def test_megatron_missing_rank_file_under_a_root(tmp_path, cli):
    root = copy(MEGATRON_ROOT, tmp_path)
    victim = "__1_1.distcp"
    (root / "iter_0000010" / victim).unlink()
    held = {fqn for fqn, f, _ in dcp_storage(MEGATRON_ITER) if f == victim}
    code, doc = check_json(cli, root)
    assert code == 1
    [problem] = doc["problems"]
    assert problem["kind"] == "missing-file" and problem["file"] == f"iter_0000010/{victim}"
    assert set(problem["tensor"].split(", ")) == held


def test_tracker_names_a_missing_iteration(tmp_path, cli):
    root = copy(MEGATRON_ROOT, tmp_path)
    (root / TRACKER).write_text("20")
    result = cli("check", str(root))
    assert result.code == 1
    [line] = problem_lines(result)
    assert line.startswith(f"tracker: {TRACKER}: names iteration 20") and "found: 10" in line
    (root / TRACKER).unlink()
    code, doc = check_json(cli, root)
    assert code == 1 and doc["format"] == "megatron_dist"  # the newest iteration is still checked
    assert [(p["kind"], p["file"]) for p in doc["problems"]] == [("missing-marker", TRACKER)]


def test_tracked_iteration_with_nothing_in_it(tmp_path):
    root = tmp_path / "save"
    (root / "iter_0000030").mkdir(parents=True)
    (root / "iter_0000030" / "half_written.tmp").write_bytes(b"\0" * 10)
    (root / TRACKER).write_text("30")
    report = check_checkpoint(root)
    assert [(p.kind, p.file) for p in report.problems] == [("incomplete", "iter_0000030")]
    assert report.format is None


# --- damaged HF directories -----------------------------------------------------------------------


def test_hf_index_points_to_wrong_shard(samples, tmp_path, cli):
    path = copy(samples["hf_llama_sharded"], tmp_path)
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.layers.0.mlp.up_proj.weight"
    shard = index["weight_map"][name]
    other = next(s for s in sorted(set(index["weight_map"].values())) if s != shard)
    index["weight_map"][name] = other
    index_path.write_text(json.dumps(index))
    code, doc = check_json(cli, path)
    assert code == 1
    [problem] = doc["problems"]
    assert problem == {"kind": "index-mismatch", "file": other, "tensor": name, "detail": problem["detail"]}
    assert f"places it in {other}, which does not contain it; it is stored in {shard}" in problem["detail"]


def test_hf_missing_shard(samples, tmp_path, cli):
    path = copy(samples["hf_llama_sharded"], tmp_path)
    shard = "model-00002-of-00004.safetensors"
    (path / shard).unlink()
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    code, doc = check_json(cli, path)
    assert code == 1
    [problem] = doc["problems"]
    assert problem["kind"] == "missing-file" and problem["file"] == shard
    assert set(problem["tensor"].split(", ")) == {n for n, s in weight_map.items() if s == shard}
    assert doc["checked"]["tensors"] == sum(1 for s in weight_map.values() if s != shard)


def test_hf_truncated_shard(samples, tmp_path, cli):
    path = copy(samples["hf_llama_sharded"], tmp_path)
    shard = path / "model-00001-of-00004.safetensors"
    spans = safetensors_spans(shard)
    keep = sorted(spans.values())[len(spans) // 2]  # cut after the middle tensor
    truncate(shard, keep)
    code, doc = check_json(cli, path)
    assert code == 1
    [problem] = doc["problems"]
    assert problem["kind"] == "truncated" and problem["file"] == shard.name
    assert set(problem["tensor"].split(", ")) == {n for n, end in spans.items() if end > keep}
    assert f"has {keep:,} bytes" in problem["detail"] and f"need {max(spans.values()):,}" in problem["detail"]


# --- unreadable ------------------------------------------------------------------------------------


def test_garbage_and_missing_paths_are_exit_2(tmp_path, cli):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 8)
    for path in (garbage, tmp_path / "nope"):
        result = cli("check", str(path))
        assert result.code == 2 and result.out == ""
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptscope: error: ") and str(path) in lines[0]
        assert "Traceback" not in result.err


# --- coverage, on boxes ------------------------------------------------------------------------------


def chunk(offsets, shape, file="f", **kw) -> Chunk:
    return Chunk(tuple(offsets), tuple(shape), file, **kw)


def brute_force(shape, chunks) -> np.ndarray:
    """How many chunks store each element (the definition coverage must agree with)."""
    counts = np.zeros(shape, dtype=np.int64)
    for c in chunks:
        counts[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.shape))] += 1
    return counts


def grid(shape, splits):
    """Chunks tiling ``shape``, axis ``a`` cut into ``splits[a]`` uneven pieces."""
    cuts = [sorted({0, n, *random.Random(a).sample(range(1, n), k - 1)}) for a, (n, k) in enumerate(zip(shape, splits))]
    return [chunk([lo for lo, _ in box], [hi - lo for lo, hi in box], f"rank_{i}")
            for i, box in enumerate(itertools.product(*(list(itertools.pairwise(c)) for c in cuts)))]


def test_exact_tiling_is_clean():
    chunks = grid((12, 10, 6), (3, 2, 2))
    cov = chunk_coverage((12, 10, 6), chunks)
    assert cov.exact and cov.covered == cov.numel == 720
    assert coverage_problems(TensorMeta("t", "float32", (12, 10, 6), tuple(chunks))) == []


def test_hole_is_counted():
    chunks = grid((8, 6), (2, 3))
    dropped = chunks.pop(2)
    meta = TensorMeta("w", "bfloat16", (8, 6), tuple(chunks))
    [problem] = coverage_problems(meta)
    missing = int((brute_force((8, 6), chunks) == 0).sum())
    assert missing == dropped.numel
    assert problem.kind == "hole" and problem.tensors == ("w",)
    assert f"cover {48 - missing} of 48" in problem.detail and f"{missing} are stored nowhere" in problem.detail


def test_overlap_is_found_and_holes_counted_exactly():
    chunks = [chunk((0, 0), (5, 4), "a"), chunk((3, 0), (5, 4), "b")]  # rows 3-4 twice, rows 8-9 nowhere
    meta = TensorMeta("w", "float32", (10, 4), tuple(chunks))
    problems = {p.kind: p for p in coverage_problems(meta)}
    counts = brute_force((10, 4), chunks)
    assert set(problems) == {"overlap", "hole"}
    assert f"share {int((counts > 1).sum())} elements" in problems["overlap"].detail
    assert "#0 [0:5, 0:4] (a) and #1 [3:8, 0:4] (b)" in problems["overlap"].detail
    assert f"cover {int((counts > 0).sum())} of 40" in problems["hole"].detail


def test_replica_is_an_overlap_and_empty_chunks_are_ignored():
    chunks = [chunk((0,), (4,), "r0"), chunk((0,), (4,), "r1"), chunk((4,), (0,), "r2")]
    cov = chunk_coverage((4,), chunks)
    assert cov.overlap_pairs == 1 and cov.overlaps == ((0, 1, 4),) and cov.covered == 4 and cov.holes == 0
    assert chunk_coverage((), [chunk((), ())]).exact
    assert chunk_coverage((), [chunk((), ()), chunk((), ())]).overlap_pairs == 1


def test_bad_chunks():
    meta = TensorMeta("w", "float32", (4, 4), (chunk((0, 0), (4, 4)), chunk((2, 2), (4, 4)), chunk((0,), (4,))))
    bad = [p for p in coverage_problems(meta) if p.kind == "bad-chunk"]
    assert [p.detail.split(" ")[1] for p in bad] == ["#1", "#2"]
    assert "outside the tensor's shape [4, 4]" in bad[0].detail and "1 offsets" in bad[1].detail


def test_coverage_agrees_with_brute_force_on_random_boxes():
    rng = random.Random(0)
    for _ in range(300):
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        chunks = []
        for _ in range(rng.randint(1, 5)):
            lo = [rng.randint(0, n - 1) for n in shape]
            chunks.append(chunk(lo, [rng.randint(0, n - o) for n, o in zip(shape, lo)]))
        counts = brute_force(shape, chunks)
        cov = chunk_coverage(shape, chunks)
        assert cov.covered == int((counts > 0).sum())
        assert cov.exact == bool((counts == 1).all())
        assert (cov.overlap_pairs > 0) == bool((counts > 1).any())
        boxes = [tuple((o, o + s) for o, s in zip(c.offsets, c.shape)) for c in chunks if c.numel]
        assert union_volume(boxes) == int((counts > 0).sum())


def test_twenty_thousand_sharded_tensors_are_fast(tmp_path):
    tensors = {}
    for i in range(20_000):
        rows = 64 + i % 7
        cuts = [0, rows // 4, rows // 2, 3 * rows // 4, rows]
        chunks = tuple(Chunk((lo, 0), (hi - lo, 32), f"__{r}_0.distcp", 0, (hi - lo) * 32 * 2)
                       for r, (lo, hi) in enumerate(itertools.pairwise(cuts)))
        tensors[f"layers.{i}.w"] = TensorMeta(f"layers.{i}.w", "bfloat16", (rows, 32), chunks)
    for r in range(4):
        (tmp_path / f"__{r}_0.distcp").write_bytes(b"\0" * 4096)
    index = CheckpointIndex(path=str(tmp_path), format="dcp", tensors=tensors)
    start = time.perf_counter()
    problems, files, chunks = check_index(index, tmp_path)
    elapsed = time.perf_counter() - start
    assert problems == [] and files == 4 and chunks == 80_000
    assert elapsed < 3.0, elapsed  # ~0.3 s on the 2-core dev box


def test_byte_length_against_dtype_and_shape():
    good = TensorMeta("w", "bfloat16", (4, 6), (chunk((0, 0), (4, 6), byte_length=48),))
    assert byte_length_problems(good) == []
    short = TensorMeta("w", "bfloat16", (4, 6), (chunk((0, 0), (4, 6), byte_length=40),))
    [problem] = byte_length_problems(short)
    assert problem.kind == "byte-length" and "needs 48 bytes; its byte range holds 40" in problem.detail
    # a transposed view: 6x4 with strides (1, 6) spans the whole 24-element storage
    view = TensorMeta("v", "float32", (6, 4), (chunk((0, 0), (6, 4), byte_length=96, encoding=Encoding.STRIDED,
                                                     strides=(1, 6)),))
    assert byte_length_problems(view) == []
    zipped = TensorMeta("z", "float32", (4,), (chunk((0,), (4,), byte_length=15, encoding=Encoding.TORCH_ZIP_ITEM),))
    assert "at least 16 bytes" in byte_length_problems(zipped)[0].detail


def test_tp_ranks_whose_replicated_tensors_differ_are_reported(tmp_path, cli):
    """A Megatron ``--ckpt-format torch`` save keeps every replicated tensor (norms, row-parallel biases) in
    each TP rank's file; megatron-core at TP=2 runs each rank with its own copy. A probe added 0.5 to rank
    1's copies of two norms: check, diff and convert all said nothing (the reader shows rank 0's). check
    now compares the copies and names each one that differs; an untouched save stays clean."""
    torch = pytest.importorskip("torch")
    mcore = tmp_path / "mcore"
    result = cli("convert", str(SAMPLES / "hf_llama_gqa"), str(mcore), "--to", "mcore", "--ckpt-format", "torch",
                 "--tp", "2")
    assert result.code == 0, result.err
    assert cli("check", str(mcore)).code == 0
    rank1 = next(mcore.glob("iter_*")) / "mp_rank_01" / "model_optim_rng.pt"
    state = torch.load(rank1, weights_only=False)
    state["model"]["decoder.final_layernorm.weight"] += 0.5
    torch.save(state, rank1)
    checked = cli("check", str(mcore))
    assert checked.code == 1 and "replica-mismatch" in checked.out and "decoder.final_layernorm.weight" in checked.out
    assert checked.out.count("replica-mismatch") == 1, checked.out
    # convert took rank 0's copy and exited 0; now it refuses, naming the tensor and the rank file
    for target in (["--to", "hf"], ["--to", "mcore", "--tp", "1"]):
        out = tmp_path / f"out_{target[1]}"
        converted = cli("convert", str(mcore), str(out), *target)
        assert converted.code == 2 and "TP ranks disagree" in converted.err and not out.exists(), converted.err
        assert "decoder.final_layernorm.weight" in converted.err and "mp_rank_01" in converted.err


def test_dcp_item_whose_storage_offset_misses_it_is_reported(tmp_path, cli):
    """A probe shifted one item's storage offset in a DCP ``.metadata`` by 64 bytes (re-pickled with torch's own
    classes): check said clean and only convert failed. check reads each item's first 4 bytes now; the shifted
    one is ``bad-offset``, naming its tensor, and the untouched sample stays clean."""
    import dataclasses
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    assert cli("check", str(FSDP2)).code == 0
    ckpt = copy(FSDP2, tmp_path)
    md = FileSystemReader(str(ckpt)).read_metadata()
    key, info = next(iter(md.storage_data.items()))
    md.storage_data[key] = dataclasses.replace(info, offset=info.offset + 64)
    with open(ckpt / ".metadata", "wb") as handle:
        pickle.dump(md, handle)
    result = cli("check", str(ckpt))
    assert result.code == 1, result.out + result.err
    lines = [line for line in problem_lines(result) if line.startswith("bad-offset")]
    assert len(lines) == 1 and key.fqn in lines[0] and info.relative_path in lines[0], result.out


@pytest.mark.parametrize("key, value, said", [
    ("num_hidden_layers", 10**15, "num_hidden_layers is 1000000000000000, not a positive integer up to 10,000"),
    ("architectures", [4], "architectures is [4], not a list of strings"),
    ("hidden_size", "4096", "hidden_size is '4096', not a whole number"),
])
def test_a_config_transformers_cannot_build_from_is_a_problem(tmp_path, key, value, said):
    """A probe: check said ok on an HF dir whose config.json said 10**15 layers or architectures [4], while
    convert and diff refused it (and from_pretrained would fail or never finish)."""
    from tests.conftest import run_cli

    src = tmp_path / "hf"
    shutil.copytree(SAMPLES / "hf_llama_sharded", src)
    config = json.loads((src / "config.json").read_text())
    config[key] = value
    (src / "config.json").write_text(json.dumps(config))
    result = run_cli("check", str(src))
    assert result.code == 1 and f"bad-config: config.json: {said}" in result.out, result.out + result.err
    report = json.loads(run_cli("check", "--json", str(src)).out)
    assert [(p["kind"], p["file"]) for p in report["problems"]] == [("bad-config", "config.json")]
    assert run_cli("check", str(SAMPLES / "hf_llama_sharded")).code == 0


def test_megatron_args_no_model_has_are_a_problem(tmp_path):
    """A probe: args whose num_query_groups is [2] (or 10**15 layers, a top-k over more experts than there
    are) passed check with exit 0, while convert refused them."""
    import torch

    from tests.conftest import run_cli

    src = tmp_path / "td"
    shutil.copytree(SAMPLES / "megatron_torch_dist", src)
    common = next(src.glob("iter_*/common.pt"))
    state = torch.load(common, map_location="cpu", weights_only=False)
    assert state["args"].group_query_attention
    state["args"].num_query_groups = [2]
    torch.save(state, common)
    result = run_cli("check", str(src))
    assert result.code == 1, result.out + result.err
    assert "bad-config: -: the Megatron args' num_key_value_heads is [2], not a positive integer" in result.out
    assert run_cli("check", str(SAMPLES / "megatron_torch_dist")).code == 0


def test_a_megatron_flag_that_is_no_boolean_is_a_problem(tmp_path):
    """``untie_embeddings_and_output_weights: "abc"`` read as set (untied) with check ok; convert refuses it
    (tests/test_errors.py), and check now says so. A flag stored as True/False or 0/1 is fine."""
    import shutil

    import torch

    from tests.conftest import REPO, run_cli

    for name, value in (("odd", "abc"), ("zero", 0)):
        src = tmp_path / name
        shutil.copytree(REPO / "sample_ckpts" / "mcore_llama_gqa", src)
        common = src / "iter_0000000" / "common.pt"
        state = torch.load(common, weights_only=False)
        state["args"].untie_embeddings_and_output_weights = value
        torch.save(state, common)
        result = run_cli("check", str(src))
        if value == "abc":
            assert result.code == 1 and "bad-config: -: the Megatron args' untie_embeddings_and_output_weights is " \
                "'abc', not true or false" in result.out, result.out
        else:
            assert result.code == 0, result.out
