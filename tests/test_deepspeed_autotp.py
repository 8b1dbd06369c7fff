"""DeepSpeed AutoTP saves (``tensor_parallel.autotp_size``): every TP rank's shards placed in the whole tensors.

The saves are real: ``sample_ckpts/make_deepspeed_samples.write_autotp_samples`` runs DeepSpeed 0.19.8's
engine on gloo CPU ranks (two AdamW steps, ``engine.save_checkpoint``), shipped in
``sample_ckpts/deepspeed_zero/autotp_*`` so these tests run without DeepSpeed. The judges are DeepSpeed's
own: ``consolidated`` is the engine's ``_consolidated_16bit_state_dict()`` (every TP shard gathered by
DeepSpeed itself, taken right after the save), ``universal`` is ``ds_to_universal``'s whole fp32 masters and
Adam moments; exports are judged by transformers ``from_pretrained(output_loading_info=True)``.

Before, these saves showed rank 0's local shards as the model (``lm_head`` [19, 16], ``o_proj`` [16, 8]),
check failed and exports refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.conftest import run_cli
from dist_reference import SAMPLES, assert_no_torch_on_metadata_path

from ckptscope.formats.deepspeed.autotp import Unplaceable, placement
from ckptscope.ops.opening import open_checkpoint

SHIPPED = SAMPLES / "deepspeed_zero"
VARIANTS = ("autotp_llama_tp2", "autotp_qwen2_tied_tp2", "autotp_qwen2_tp3", "autotp_llama_tp2_dp2_bf16")
TAG = "global_step2"


def _oracle(name: str) -> dict:
    return torch.load(SHIPPED / f"{name}.oracle.pt", weights_only=False)


def _bits(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """ckptscope's values in the oracle's dtype (the fp32 masters of a bf16 run rounded as DeepSpeed rounds them)."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(like.dtype)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_model_is_what_deepspeed_itself_gathers(name):
    consolidated = _oracle(name)["consolidated"]
    with open_checkpoint(SHIPPED / name) as reader:
        index = reader.index()
        for key, expected in consolidated.items():
            meta = index.tensors[key]
            assert meta.shape == tuple(expected.shape), key
            assert torch.equal(_bits(reader.read(key), expected), expected.detach()), key
        assert not index.issues and not index.warnings
        info = index.metadata["deepspeed"]["autotp"]
        assert info["tp_size"] == len(info["ranks"]) == (3 if "tp3" in name else 2)


@pytest.mark.parametrize("name", [v for v in VARIANTS if "universal" in _oracle(v)])
def test_masters_and_moments_equal_ds_to_universal(name):
    """DeepSpeed's own universal conversion rebuilds each whole param from the same affine map. Its tied
    alias (the Qwen2 lm_head) is a local shard there (a DeepSpeed 0.19.8 quirk: an alias has no map entry),
    so it is judged against the consolidated model above instead."""
    universal = _oracle(name)["universal"]
    with open_checkpoint(SHIPPED / name) as reader:
        index = reader.index()
        compared = 0
        for state, params in universal.items():
            for param, expected in params.items():
                if index.tensors[param].attr("shares_storage_with"):
                    continue
                key = param if state == "fp32" else f"optimizer.state.{state}.{param}"
                assert np.array_equal(reader.read(key), expected.detach().float().numpy()), key
                compared += 1
    assert compared >= 3 * 20


def test_uneven_and_empty_shards():
    """TP=3 over 2 KV heads splits whole heads: rank 2 holds empty q/k/v/o shards; vocab 37 splits lm_head
    13/13/11... as DeepSpeed does. (DeepSpeed's own ds_to_universal fails on this save.)"""
    assert "universal_error" in _oracle("autotp_qwen2_tp3")
    with open_checkpoint(SHIPPED / "autotp_qwen2_tp3") as reader:
        index = reader.index()
        q = index.tensors["model.layers.0.self_attn.q_proj.weight"]
        assert q.shape == (16, 16) and sorted(c.offsets[0] for c in q.chunks) == [0, 8]
        head = index.tensors["lm_head.weight"]
        assert head.shape == (37, 16) and sum(c.shape[0] for c in head.chunks) == 37


def test_reading_needs_no_torch():
    assert_no_torch_on_metadata_path(SHIPPED / "autotp_qwen2_tp3", read="model.layers.1.self_attn.o_proj.weight")


def test_check_inspect_and_layout():
    result = run_cli("check", str(SHIPPED / "autotp_qwen2_tied_tp2"))
    assert result.code == 0, result.out + result.err
    result = run_cli("inspect", "--json", str(SHIPPED / "autotp_qwen2_tied_tp2"))
    doc = json.loads(result.out)
    assert "AutoTP over 2 ranks" in doc["iteration_layout"]
    shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == [38, 16]
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == [16, 16]


@pytest.mark.parametrize("name", ["autotp_qwen2_tied_tp2", "autotp_llama_tp2_dp2_bf16"])
def test_merge_to_hf_loads_in_transformers(name, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    result = run_cli("merge", str(SHIPPED / name), str(out), "--hf-config", str(SHIPPED / f"{name}_hf_config"))
    assert result.code == 0, result.err
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    state = model.state_dict()
    for key, expected in _oracle(name)["consolidated"].items():
        assert torch.equal(state[key].to(expected.dtype), expected.detach()), key


def test_a_missing_rank_is_a_problem_and_exports_refuse(tmp_path):
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "autotp_llama_tp2", save)
    for file in (save / TAG).glob("*mp_rank_01_*"):
        file.unlink()
    result = run_cli("check", str(save))
    assert result.code == 1 and f"missing-file: {TAG}/mp_rank_01_model_states.pt" in result.out, result.out
    result = run_cli("merge", str(save), str(tmp_path / "hf"), "--hf-config", str(SHIPPED / "autotp_llama_tp2_hf_config"))
    assert result.code == 2 and not (tmp_path / "hf").exists(), result.err
    with open_checkpoint(save) as reader:
        head = reader.index().tensors["lm_head.weight"]
        assert head.shape == (38, 16)
        assert reader.read("lm_head.weight", (slice(0, 19),)).shape == (19, 16)  # rank 0's half stays readable
        with pytest.raises(Exception, match="mp_rank_01_model_states.pt"):
            reader.read("lm_head.weight")


def test_a_drifted_replicated_norm_is_a_replica_mismatch(tmp_path):
    """Each TP rank keeps its own fp32 master of a replicated norm; an export writes rank 0's. A rank whose
    copy drifted runs another model: check says so."""
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "autotp_llama_tp2", save)
    with open_checkpoint(save) as reader:
        reader.index()
        copy = reader._replicas["model.norm.weight"][0]
    with open(save / copy.file, "r+b") as handle:
        handle.seek(copy.byte_offset)
        handle.write(np.float32(3.0).tobytes())
    result = run_cli("check", str(save))
    assert result.code == 1 and "replica-mismatch" in result.out and copy.file in result.out, result.out


def test_a_placement_that_is_no_box_leaves_the_save_unassembled(tmp_path):
    """Sub-params of a fused weight (two pieces per rank) are not placed: the save reads as before, rank 0
    only, check fails naming the other rank's files and the reason, exports refuse."""
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "autotp_llama_tp2", save)
    for rank in ("00", "01"):
        path = save / TAG / f"mp_rank_{rank}_model_states.pt"
        state = torch.load(path, weights_only=False)
        entry = state["universal_checkpoint_info"]["affine_map"]["params"]["^model\\.layers\\.0\\.mlp\\.gate_proj\\.weight$"]
        for rank_entry in entry["ranks"].values():
            piece = rank_entry["pieces"][0]
            half = [piece["shape"][0] // 2, piece["shape"][1]]
            rank_entry["pieces"] = [dict(piece, shape=half), dict(piece, shape=half, source=[piece["source"][0] + 96,
                                                                                              piece["source"][1]])]
        torch.save(state, path)
    result = run_cli("check", str(save))
    assert result.code == 1 and "unassembled-file" in result.out and "sub-params" in result.out, result.out
    result = run_cli("merge", str(save), str(tmp_path / "hf"), "--hf-config", str(SHIPPED / "autotp_llama_tp2_hf_config"))
    assert result.code == 2 and not (tmp_path / "hf").exists(), result.err


@pytest.mark.parametrize("entry, reason", [
    ({"logical_shape": [4, 2], "ranks": {"0": {"shard_shape": [2, 2], "pieces": [
        {"shape": [2, 2], "source": [0, [2, 1]], "dest": [0, [2, 1]], "locations": [0]}]}}}, "hold 4 elements"),
    ({"logical_shape": [4, 2], "ranks": {r: {"shard_shape": [2, 2], "pieces": [
        {"shape": [2, 2], "source": [2, [2, 1]], "dest": [0, [2, 1]], "locations": [int(r)]}]} for r in "01"}},
     "hold 4 elements"),
    ({"logical_shape": [4, 2], "ranks": {"0": {"shard_shape": [2, 2], "pieces": [
        {"shape": [2, 2], "source": [0, [1, 4]], "dest": [0, [2, 1]], "locations": [0]}]}}}, "not a box"),
    ({"logical_shape": [4, 2], "ranks": {"0": {"shard_shape": [4, 2], "pieces": [
        {"shape": [4, 2], "source": [2, [2, 1]], "dest": [0, [2, 1]], "locations": [0]}]}}}, "outside"),
])
def test_placements_that_do_not_tile_are_refused(entry, reason):
    with pytest.raises(Unplaceable, match=reason):
        placement("w", entry)


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


@pytest.mark.parametrize("name, files", [
    ("autotp_llama_tp2", ("zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt")),
    ("zero2", ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")),
])
def test_optimizer_files_of_swapped_ranks_are_found(name, files, tmp_path):
    """Two ranks' optimizer files swapped (TP ranks of an AutoTP save, DP ranks of a ZeRO-2 save) read as a
    model with its shards in each other's place: check said ok and merge exported it (a probe: every split
    weight's halves swapped). Each file's fp32 masters are compared with the module's own copy DeepSpeed
    writes from them."""
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / name, save)
    _swap(save / TAG / files[0], save / TAG / files[1])
    result = run_cli("check", str(save))
    assert result.code == 1, result.out
    for file in files:
        assert f"copy-mismatch: {TAG}/{file}" in result.out, result.out
    config = SHIPPED / (f"{name}_hf_config" if name.startswith("autotp") else "hf_config")
    result = run_cli("merge", str(save), str(tmp_path / "hf"), "--hf-config", str(config))
    assert result.code == 2 and "another rank or another save" in result.err and not (tmp_path / "hf").exists()
    assert run_cli("check", str(SHIPPED / name)).code == 0  # the untouched save: the copies agree


def test_a_tp_rank_without_its_optimizer_files_is_refused(tmp_path):
    """Its shards would read as the module copy beside the other ranks' fp32 masters (bf16 beside fp32 in a
    bf16 run): holes and a missing-file problem instead, and the export refuses."""
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "autotp_llama_tp2_dp2_bf16", save)
    for file in (save / TAG).glob("bf16_zero_pp_rank_*_mp_rank_01_optim_states.pt"):
        file.unlink()
    result = run_cli("check", str(save))
    assert result.code == 1 and f"missing-file: {TAG}/bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt" in result.out
    result = run_cli("merge", str(save), str(tmp_path / "hf"), "--hf-config",
                     str(SHIPPED / "autotp_llama_tp2_dp2_bf16_hf_config"))
    assert result.code == 2 and "TP rank 1's optimizer partitions" in result.err and not (tmp_path / "hf").exists()


def test_an_affine_map_with_other_rank_keys_is_refused():
    entry = {"logical_shape": [4, 2], "ranks": {"first": {"shard_shape": [4, 2], "pieces": [
        {"shape": [4, 2], "source": [0, [2, 1]], "dest": [0, [2, 1]], "locations": [0]}]}}}
    with pytest.raises(Unplaceable, match="not rank numbers"):
        placement("w", entry)
