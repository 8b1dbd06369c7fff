"""Megatron-LM legacy ``--ckpt-format torch`` iteration dirs, read as one logical model.

Fixtures come from sample_ckpts/make_legacy_samples.py: megatron-core GPTModels on gloo CPU ranks,
saved per rank with ``torch.save`` as Megatron training does. The oracle is written by the same
ranks: every parameter gathered over TP with megatron's own ``partition_dim``/``partition_stride``
attributes and named with megatron's ``layer_number`` and ``local_expert_indices``; ckptscope has to
reach the same from names and ``args`` alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys

import numpy as np
import pytest
from dist_reference import SAMPLES, assert_no_torch_on_metadata_path

from ckptscope.cli import main as cli_main
from ckptscope.formats import open_checkpoint
from ckptscope.formats.megatron.legacy_layout import (
    Split,
    counts_from_offsets,
    globalize,
    layer_offsets,
    parse_rank_dir,
    tp_split,
)
from ckptscope.formats.megatron.legacy_reader import MegatronLegacyReader, is_complete_save
from ckptscope.formats.registry import detect_format
from ckptscope.formats.torch_save.zip_reader import TorchZipReader
from ckptscope.ops.roots import discover_iterations

CASES = ["megatron_legacy_tp2", "megatron_legacy_pp2", "megatron_legacy_vpp", "megatron_legacy_ep2"]
ITER = "iter_0000020"
FC1 = "decoder.layers.{}.mlp.linear_fc1.weight"


def generator():
    if str(SAMPLES) not in sys.path:  # importable by name, so spawned ranks can unpickle their target
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_legacy_samples")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("legacy")
    roots = generator().write_cases(out, CASES, reference=True)
    return out, roots


def reference(out, case: str) -> dict:
    """The gathered tensors of every writing rank, merged (replicas must agree exactly)."""
    import torch

    merged: dict = {}
    for path in sorted((out / f"{case}_reference").glob("rank_*.pt")):
        for name, tensor in torch.load(path).items():
            if name in merged:
                assert torch.equal(merged[name], tensor), name
            merged[name] = tensor
    return merged


def bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def torch_bits(tensor) -> bytes:
    return tensor.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def readers(written):
    _, roots = written
    opened = {case: open_checkpoint(roots[case] / ITER) for case in CASES}
    yield opened
    for reader in opened.values():
        reader.close()


@pytest.mark.parametrize("case", CASES)
def test_every_logical_tensor_equals_megatron_gather(written, readers, case):
    out, _ = written
    reader = readers[case]
    index = reader.index()
    assert isinstance(reader, MegatronLegacyReader) and index.format == "megatron_legacy"
    assert index.warnings == []
    want = reference(out, case)
    model = {n: t for n, t in index.tensors.items() if t.attr("group") == "model"}
    assert set(model) == set(want)
    for name, tensor in want.items():
        meta = model[name]
        assert meta.shape == tuple(tensor.shape), name
        assert meta.dtype == str(tensor.dtype).removeprefix("torch."), name
        assert bits(reader.read(name)) == torch_bits(tensor), name


@pytest.mark.parametrize("case", CASES)
def test_global_shapes_from_config(written, readers, case):
    gen = generator()
    tp = gen.CASES[case].get("tp", 1)
    tensors = readers[case].index().tensors
    qkv_rows = (gen.HEADS + 2 * gen.GROUPS) * (gen.HIDDEN // gen.HEADS)
    assert tensors["embedding.word_embeddings.weight"].shape == (gen.padded_vocab(tp), gen.HIDDEN)
    assert gen.padded_vocab(tp) % (gen.DIVISIBLE_BY * tp) == 0 and gen.padded_vocab(tp) >= gen.TRUE_VOCAB
    layers = gen.CASES[case]["num_layers"]
    for i in range(layers):
        assert tensors[f"decoder.layers.{i}.self_attention.linear_qkv.weight"].shape == (qkv_rows, gen.HIDDEN)
        assert tensors[f"decoder.layers.{i}.self_attention.linear_proj.weight"].shape == (gen.HIDDEN, gen.HIDDEN)
        if case != "megatron_legacy_ep2":
            assert tensors[FC1.format(i)].shape == (2 * gen.FFN, gen.HIDDEN)
            assert tensors[f"decoder.layers.{i}.mlp.linear_fc2.weight"].shape == (gen.HIDDEN, gen.FFN)


def test_tp_chunks_point_into_each_rank_file(readers):
    index = readers["megatron_legacy_tp2"].index()
    emb = index.tensors["embedding.word_embeddings.weight"]
    rows = generator().padded_vocab(2) // 2
    assert [(c.offsets, c.file) for c in emb.chunks] == [((0, 0), "mp_rank_00/model_optim_rng.pt"),
                                                        ((rows, 0), "mp_rank_01/model_optim_rng.pt")]
    proj = index.tensors["decoder.layers.1.self_attention.linear_proj.weight"]  # row-parallel: dim 1
    assert [(c.offsets, c.shape) for c in proj.chunks] == [((0, 0), (32, 16)), ((0, 16), (32, 16))]
    norm = index.tensors["decoder.layers.0.input_layernorm.weight"]  # replicated: TP rank 0 only
    assert [c.file for c in norm.chunks] == ["mp_rank_00/model_optim_rng.pt"]
    fc1 = index.tensors[FC1.format(0)]
    assert len(fc1.chunks) == 4 and len({(c.file, c.byte_offset) for c in fc1.chunks}) == 4  # two per rank file
    # A region that spans both ranks touches only what it needs and matches the full read.
    reader = readers["megatron_legacy_tp2"]
    full = reader.read("embedding.word_embeddings.weight")
    box = (slice(rows - 8, rows + 8), slice(3, 9))
    assert bits(reader.read("embedding.word_embeddings.weight", box)) == bits(full[box])


def test_fc1_is_gate_then_up(written, readers):
    """MAPPING.md §3.2: rank t holds [gate_t; up_t]; the global tensor is [gate; up]."""
    import torch

    _, roots = written
    files = [torch.load(roots["megatron_legacy_tp2"] / ITER / f"mp_rank_0{t}" / "model_optim_rng.pt",
                        weights_only=False) for t in range(2)]
    reader = readers["megatron_legacy_tp2"]
    for layer in range(2):
        shards = [f["model"][FC1.format(layer)] for f in files]
        half = shards[0].shape[0] // 2
        gate = torch.cat([s[:half] for s in shards])
        up = torch.cat([s[half:] for s in shards])
        got = reader.read(FC1.format(layer))
        assert bits(got[: 2 * half]) == torch_bits(gate)
        assert bits(got[2 * half:]) == torch_bits(up)
        assert bits(got) != torch_bits(torch.cat(shards))  # the plain concat is not it


@pytest.mark.parametrize("case", ["megatron_legacy_pp2", "megatron_legacy_vpp"])
def test_pipeline_layers_cover_every_global_index_once(written, readers, case):
    gen = generator()
    spec = gen.CASES[case]
    index = readers[case].index()
    layers = spec["num_layers"]
    seen: dict[int, set[str]] = {}
    for name, meta in index.tensors.items():
        parts = name.split(".")
        if parts[:2] == ["decoder", "layers"]:
            seen.setdefault(int(parts[2]), set()).update(c.file for c in meta.chunks)
    assert sorted(seen) == list(range(layers))
    pp, vpp = spec["pp"], spec.get("vpp")
    if vpp:  # MAPPING.md §5.1: offset(p, v) = v * L/Vp + p * L/(P*Vp)
        expected = {f"pp{p}.vpp{v}": v * layers // vpp + p * layers // (pp * vpp) for v in range(vpp)
                    for p in range(pp)}
    else:  # uneven: the first stage holds num_layers_in_first_pipeline_stage layers
        first = spec["first_stage_layers"]
        expected = {"pp0": 0, "pp1": first}
        assert seen[0] == {"mp_rank_00_000/model_optim_rng.pt"}
        assert all(seen[i] == {"mp_rank_00_001/model_optim_rng.pt"} for i in range(first, layers))
    assert index.metadata["megatron_legacy"]["layer_offsets"] == expected


def test_tied_output_layer_copy_on_last_stage(readers):
    reader = readers["megatron_legacy_pp2"]
    meta = reader.meta("output_layer.weight")
    assert meta.attr("tied_copy_of") == "embedding.word_embeddings.weight"
    assert meta.files == ("mp_rank_00_001/model_optim_rng.pt",)
    assert bits(reader.read("output_layer.weight")) == bits(reader.read("embedding.word_embeddings.weight"))
    assert "output_layer.weight" not in readers["megatron_legacy_tp2"].index().tensors  # tied, PP=1


def test_experts_get_global_ids(readers):
    index = readers["megatron_legacy_ep2"].index()
    for layer in range(2):
        prefix = f"decoder.layers.{layer}.mlp.experts.local_experts."
        ids = sorted({int(n[len(prefix):].split(".")[0]) for n in index.tensors if n.startswith(prefix)})
        assert ids == [0, 1, 2, 3]
        third = index.tensors[f"{prefix}2.linear_fc1.weight"]
        assert third.files == ("mp_rank_00_001/model_optim_rng.pt",)
        assert third.attr("stored_as") == f"model.{prefix}0.linear_fc1.weight"
        router = index.tensors[f"decoder.layers.{layer}.mlp.router.weight"]  # dense: from EP rank 0
        assert router.files == ("mp_rank_00_000/model_optim_rng.pt",)


def test_objects_and_optimizer_groups(written, readers):
    import torch

    _, roots = written
    index = readers["megatron_legacy_tp2"].index()
    objects = {o.name: o for o in index.objects}
    saved = torch.load(roots["megatron_legacy_tp2"] / ITER / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)
    assert objects["args"].type == "argparse.Namespace"
    args = {k: v for k, v in objects["args"].value.items() if k != "__class__"}
    assert args["tensor_model_parallel_size"] == saved["args"].tensor_model_parallel_size == 2
    assert set(args) == set(vars(saved["args"]))
    assert objects["iteration"].value == saved["iteration"] == index.iteration == 20
    assert objects["checkpoint_version"].value == 3.0
    assert objects["opt_param_scheduler"].value == saved["opt_param_scheduler"]
    assert {"rng_state.mp_rank_00", "rng_state.mp_rank_01"} <= set(objects)
    assert objects["rng_state.mp_rank_00"].value[0]["torch_rng_state"].startswith("<Tensor uint8")
    extra = [n for n in objects if n.endswith("._extra_state")]
    assert "decoder.layers.1.mlp.linear_fc2._extra_state" in extra
    assert not any(n.endswith("_extra_state") for n in index.tensors)
    # distrib_optim.pt: opaque flat fp32 buffers per rank, in the optimizer group.
    dist = torch.load(roots["megatron_legacy_tp2"] / ITER / "mp_rank_01" / "distrib_optim.pt", weights_only=False)
    buffer = dist[0][(torch.bfloat16, torch.float32)]
    name = "distrib_optim.mp_rank_01.0.bfloat16/float32.exp_avg_sq"
    assert index.tensors[name].attr("group") == "optimizer" and "flat" in index.tensors[name].attr("layout")
    assert bits(readers["megatron_legacy_tp2"].read(name)) == torch_bits(buffer["exp_avg_sq"])
    assert objects["distrib_optim.mp_rank_01.0.bfloat16/float32.numel_unpadded"].value == buffer["numel_unpadded"]
    groups = index.metadata["groups"]
    assert groups["model"]["tensors"] == len(reference(written[0], "megatron_legacy_tp2"))
    # Non-distributed optimizer state: per rank, tensors in the optimizer group.
    pp2 = readers["megatron_legacy_pp2"].index()
    state = [n for n in pp2.tensors if n.startswith("optimizer.mp_rank_00_001.state.")]
    assert state and all(pp2.tensors[n].attr("group") == "optimizer" for n in state)


def test_metadata_path_imports_no_torch(written):
    _, roots = written
    assert_no_torch_on_metadata_path(roots["megatron_legacy_vpp"] / ITER, read=FC1.format(5))


def test_inspect_json(written, capsys):
    _, roots = written
    cli_main(["inspect", str(roots["megatron_legacy_tp2"] / ITER), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "megatron_legacy"
    shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
    assert shapes[FC1.format(1)] == [96, 32]
    assert {"args", "iteration", "checkpoint_version"} <= {o["name"] for o in doc["objects"]}
    assert doc["metadata"]["iteration"] == 20 and doc["metadata"]["warnings"] == []


def test_single_rank_file_is_a_plain_torch_file(written):
    _, roots = written
    rank_file = roots["megatron_legacy_tp2"] / ITER / "mp_rank_01" / "model_optim_rng.pt"
    assert detect_format(rank_file) is TorchZipReader
    assert detect_format(roots["megatron_legacy_tp2"] / ITER) is MegatronLegacyReader
    local = open_checkpoint(rank_file).index().tensors
    gen = generator()
    assert local["model.embedding.word_embeddings.weight"].shape == (gen.padded_vocab(2) // 2, gen.HIDDEN)


def test_shipped_sample_matches_the_generator(readers):
    shipped = open_checkpoint(SAMPLES / "megatron_legacy_tp2" / ITER).index()
    fresh = readers["megatron_legacy_tp2"].index()
    assert {n: (t.shape, t.dtype) for n, t in shipped.tensors.items()} == \
        {n: (t.shape, t.dtype) for n, t in fresh.tensors.items()}
    assert [i.iteration for i in discover_iterations(SAMPLES / "megatron_legacy_tp2")] == [20]


def test_incomplete_saves(written, tmp_path):
    _, roots = written
    root = tmp_path / "save"
    shutil.copytree(roots["megatron_legacy_tp2"], root)
    (root / ITER).rename(root / "iter_0000030")
    shutil.copytree(root / "iter_0000030", root / ITER)
    assert all(info.complete for info in discover_iterations(root))
    assert is_complete_save(root / ITER)
    # A crashed torch.save: the zip has no central directory yet.
    victim = root / "iter_0000030" / "mp_rank_01" / "model_optim_rng.pt"
    victim.write_bytes(victim.read_bytes()[:4096])
    # A rank that never wrote its file.
    (root / ITER / "mp_rank_01" / "model_optim_rng.pt").unlink()
    assert {i.iteration: i.complete for i in discover_iterations(root)} == {30: False, 20: False}
    index = open_checkpoint(root / ITER).index()
    assert any("mp_rank_01/model_optim_rng.pt is missing" in w for w in index.warnings)
    emb = index.tensors["embedding.word_embeddings.weight"]
    assert emb.shape == (generator().padded_vocab(2), 32) and [c.offsets for c in emb.chunks] == [(0, 0)]
    with open_checkpoint(root / ITER) as reader:  # the missing rank's rows read as zeros
        rows = emb.chunks[0].shape[0]
        assert not reader.read(emb.name)[rows:].any() and reader.read(emb.name)[:rows].any()
    index = open_checkpoint(root / "iter_0000030").index()
    assert any("mp_rank_01/model_optim_rng.pt" in w for w in index.warnings)
    # A damaged first rank: args come from the next one, the rest stays browsable.
    first = root / "iter_0000040"
    shutil.copytree(roots["megatron_legacy_tp2"] / ITER, first)
    (first / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"PK\x03\x04 not a zip")
    index = open_checkpoint(first).index()
    assert index.metadata["megatron_legacy"]["tensor_model_parallel_size"] == 2
    assert any(w.startswith("mp_rank_00/model_optim_rng.pt") for w in index.warnings)
    assert index.tensors["embedding.word_embeddings.weight"].files == ("mp_rank_01/model_optim_rng.pt",)


def test_old_nested_language_model_layout(tmp_path):
    """Pre-mcore files nest ``model -> language_model -> {embedding, encoder}`` (FORMATS.md §3.2).

    The shards are cut from known full tensors with torch (the oracle) and saved with torch.save.
    """
    import torch

    gen = torch.Generator().manual_seed(3)
    full = {
        "embedding.word_embeddings.weight": torch.randn(16, 8, generator=gen),
        "encoder.layers.0.self_attention.query_key_value.weight": torch.randn(24, 8, generator=gen),
        "encoder.layers.0.self_attention.dense.weight": torch.randn(8, 8, generator=gen),
        "encoder.layers.0.mlp.dense_h_to_4h.weight": torch.randn(12, 8, generator=gen),  # [gate(6); up(6)]
        "encoder.layers.0.mlp.dense_4h_to_h.weight": torch.randn(8, 6, generator=gen),
        "encoder.layers.0.input_norm.weight": torch.randn(8, generator=gen),
        "encoder.final_norm.weight": torch.randn(8, generator=gen),
    }
    gate, up = full["encoder.layers.0.mlp.dense_h_to_4h.weight"].chunk(2)
    it = tmp_path / "iter_0000007"
    for t in range(2):
        def shard(key, dim, t=t):
            return full[key].chunk(2, dim=dim)[t].clone()
        encoder = {
            "layers.0.self_attention.query_key_value.weight": shard(
                "encoder.layers.0.self_attention.query_key_value.weight", 0),
            "layers.0.self_attention.dense.weight": shard("encoder.layers.0.self_attention.dense.weight", 1),
            "layers.0.mlp.dense_h_to_4h.weight": torch.cat([gate.chunk(2)[t], up.chunk(2)[t]]).clone(),
            "layers.0.mlp.dense_4h_to_h.weight": shard("encoder.layers.0.mlp.dense_4h_to_h.weight", 1),
            "layers.0.input_norm.weight": full["encoder.layers.0.input_norm.weight"].clone(),
            "final_norm.weight": full["encoder.final_norm.weight"].clone(),
        }
        state = {"args": argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=1,
                                            num_layers=1, swiglu=True),
                 "checkpoint_version": 3.0, "iteration": 7,
                 "model": {"language_model": {
                     "embedding": {"word_embeddings": {"weight": shard("embedding.word_embeddings.weight", 0)}},
                     "encoder": encoder}}}
        (it / f"mp_rank_0{t}").mkdir(parents=True)
        torch.save(state, it / f"mp_rank_0{t}" / "model_optim_rng.pt")
    with open_checkpoint(it) as reader:
        index = reader.index()
        assert index.warnings == []
        assert set(index.tensors) == {f"language_model.{k}" for k in full}
        for key, tensor in full.items():
            assert index.tensors[f"language_model.{key}"].shape == tuple(tensor.shape), key
            assert bits(reader.read(f"language_model.{key}")) == torch_bits(tensor), key


# --- the naming and offset rules on their own (values from MAPPING.md) -------------------------------


def test_vpp_offsets_match_the_mapping_example():
    # MAPPING.md §5.1: L=16, P=2, Vp=2 -> pp0: 0-3 and 8-11, pp1: 4-7 and 12-15.
    offsets = layer_offsets({"num_layers": 16}, pp=2, vpp=2)
    assert offsets == {(0, 0): 0, (1, 0): 4, (0, 1): 8, (1, 1): 12}
    assert set(counts_from_offsets(offsets, 16).values()) == {4}


def test_uneven_and_layout_offsets():
    args = {"num_layers": 7, "num_layers_in_first_pipeline_stage": 1, "num_layers_in_last_pipeline_stage": 2}
    assert layer_offsets(args, pp=3, vpp=None) == {(0, 0): 0, (1, 0): 1, (2, 0): 5}
    old_names = {"num_layers": 5, "decoder_first_pipeline_num_layers": 1}
    assert layer_offsets(old_names, pp=2, vpp=None) == {(0, 0): 0, (1, 0): 1}
    embedding = {"num_layers": 7, "account_for_embedding_in_pipeline_split": True}
    assert layer_offsets(embedding, pp=2, vpp=None) == {(0, 0): 0, (1, 0): 3}
    layout = {"num_layers": 6, "pipeline_model_parallel_layout": "Et|(tt|)*2,tL"}
    assert layer_offsets(layout, pp=2, vpp=2) == {(0, 0): 0, (1, 0): 1, (0, 1): 3, (1, 1): 5}


def test_rank_dir_names_need_the_sizes():
    assert parse_rank_dir("mp_rank_01_003", pp=4, ep=1) == (1, 3, 0)
    assert parse_rank_dir("mp_rank_01_003", pp=1, ep=4) == (1, 0, 3)
    assert parse_rank_dir("mp_rank_01_002_003", pp=4, ep=4) == (1, 2, 3)
    assert parse_rank_dir("mp_rank_01_003", pp=1, ep=1) is None


def test_split_table_and_expert_ids():
    assert tp_split("decoder.layers.0.mlp.linear_fc1.weight", swiglu=True) is Split.GLU
    assert tp_split("decoder.layers.0.mlp.linear_fc1.weight", swiglu=False) is Split.COLUMN
    assert tp_split("decoder.layers.0.self_attention.linear_qkv.bias", swiglu=True) is Split.COLUMN
    assert tp_split("decoder.layers.0.self_attention.linear_proj.weight", swiglu=True) is Split.ROW
    assert tp_split("decoder.layers.0.self_attention.linear_proj.bias", swiglu=True) is Split.REPLICATED
    assert tp_split("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", swiglu=True) is Split.REPLICATED
    assert tp_split("decoder.layers.0.mlp.router.weight", swiglu=True) is Split.REPLICATED
    assert tp_split("decoder.layers.0.mlp.experts.linear_fc2.weight3", swiglu=True) is Split.ROW
    # Global expert id = ep_rank * E_local + local, for both naming schemes (MAPPING.md §6.2).
    assert globalize("decoder.layers.1.mlp.experts.linear_fc1.weight3", 4, 8) == \
        "decoder.layers.5.mlp.experts.linear_fc1.weight11"
    assert globalize("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", 2, 4) == \
        "decoder.layers.2.mlp.experts.local_experts.5.linear_fc2.weight"
    assert globalize("language_model.encoder.layers.3.mlp.dense_4h_to_h.weight", 4, 0) == \
        "language_model.encoder.layers.7.mlp.dense_4h_to_h.weight"


def test_a_value_head_is_named_for_what_it_is(tmp_path, cli):
    """verl's Megatron critic ends in ``LinearForLastLayer(hidden, 1)``: an ``output_layer.weight`` of one row.
    convert said 'the vocabulary has 128 rows but the Megatron table only 1', as if the save were damaged."""
    import torch

    out = tmp_path / "mc"
    done = cli("convert", str(SAMPLES / "hf_llama_gqa"), str(out), "--to", "mcore",
                   "--ckpt-format", "torch")
    assert done.code == 0, done.err
    rank_file = next(out.rglob("model_optim_rng.pt"))
    state = torch.load(rank_file, weights_only=False)
    head = state["model"]["output_layer.weight"]
    state["model"]["output_layer.weight"] = head[:1].clone()
    torch.save(state, rank_file)
    result = cli("convert", str(out), "--to", "hf", str(tmp_path / "hf"))
    assert result.code == 2 and "a value head" in result.err and result.err.count("\n") == 1, result.err


def _with_rank_args(tmp_path, **changes):
    """A copy of the shipped TP=2 save whose every rank file's args carry ``changes``."""
    import torch

    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "megatron_legacy_tp2", src)
    for rank_file in sorted(src.rglob("model_optim_rng.pt")):
        state = torch.load(rank_file, weights_only=False)
        for key, value in changes.items():
            setattr(state["args"], key, value)
        torch.save(state, rank_file)
    return src


def test_args_with_more_layers_than_any_model_are_a_warning_not_a_crash(tmp_path, cli):
    """A probe set args.num_layers to 10**15: inspect, check and diff built the set of every layer number
    the args imply and ran out of memory (killed, or 'internal error: MemoryError'). Now the layers the
    rank files hold are compared without it: inspect warns which are missing, convert refuses the args."""
    import torch

    rank_file = next((SAMPLES / "megatron_legacy_tp2").rglob("model_optim_rng.pt"))
    stored = torch.load(rank_file, weights_only=False)["args"].num_layers  # the layers the files hold
    src = _with_rank_args(tmp_path, num_layers=10**15)
    result = cli("inspect", "--json", str(src))
    assert result.code == 0, result.err
    missing = list(range(stored, stored + 10))
    assert f"layers do not cover 0..{10**15 - 1}: missing {missing}, beyond []" in result.err
    checked = cli("check", str(src))  # every stored byte is where the metadata says; the args are no model's
    assert checked.code == 1 and "bad-config: -: the Megatron args' num_hidden_layers / num_layers is" in checked.out
    result = cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and "num_layers is 1000000000000000" in result.err, result.err


def test_args_with_a_tp_size_no_save_has_are_missing_files_not_a_crash(tmp_path, cli):
    """A probe set args.tensor_model_parallel_size to 10**15: the reader listed every rank the sizes imply
    and ran out of memory. Now the missing ranks are counted and the first few named."""
    src = _with_rank_args(tmp_path, tensor_model_parallel_size=10**15)
    result = cli("inspect", str(src))
    assert result.code == 0, result.err
    assert f"{10**15 - 2} rank file(s) missing (tp2/pp0/ep0, tp3/pp0/ep0," in result.err
    assert cli("check", str(src)).code == 1
    result = cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and "the checkpoint is damaged" in result.err and "internal error" not in result.err


def test_args_with_more_virtual_stages_than_the_files_hold_are_counted_from_the_files(tmp_path, cli):
    """A probe set args.virtual_pipeline_model_parallel_size to 10**15: the layer offsets listed that many
    stages and ran out of memory. The rank files hold one model chunk each: layers are counted from them."""
    src = _with_rank_args(tmp_path, virtual_pipeline_model_parallel_size=10**15)
    result = cli("inspect", "--json", str(src))
    assert result.code == 0, result.err
    assert (f"args say {10**15} virtual pipeline stages, the rank files hold 1 model chunk: global layer indices "
            "are counted from the files") in result.err
    names = {t["name"] for t in json.loads(result.out)["tensors"]}
    original = {t["name"] for t in json.loads(cli("inspect", "--json", str(SAMPLES / "megatron_legacy_tp2")).out)["tensors"]}
    assert names == original


@pytest.mark.parametrize("key, value, said", [
    ("num_query_groups", 4, "its num_query_groups is 4 where the first rank file's is"),
    ("tensor_model_parallel_size", 4, "its tensor_model_parallel_size is 4 where the first rank file's is 2"),
    ("iteration", 30, "its iteration is 30 where the first rank file's is 20"),
])
def test_a_rank_file_of_another_save_is_an_args_mismatch(tmp_path, cli, key, value, said):
    """A probe: rank 1's args said TP 4 (or another model), and inspect, check and convert read rank 0's args
    without a word. A rank file of another run or save: check reports it, exports refuse it."""
    import torch

    src = tmp_path / "src"
    shutil.copytree(SAMPLES / "megatron_legacy_tp2", src)
    rank_file = src / ITER / "mp_rank_01" / "model_optim_rng.pt"
    state = torch.load(rank_file, weights_only=False)
    if key == "iteration":
        state["iteration"] = value
    else:
        setattr(state["args"], key, value)
    torch.save(state, rank_file)
    result = cli("check", str(src))
    assert result.code == 1 and f"args-mismatch: {ITER}/mp_rank_01/model_optim_rng.pt: {said}" in result.out, result.out
    result = cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and said in result.err and "mixed into the model" in result.err, result.err
    assert not (tmp_path / "hf").exists()
    assert cli("check", str(SAMPLES / "megatron_legacy_tp2")).code == 0
