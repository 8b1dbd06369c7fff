"""verl checkpoint dirs: FSDP actor (DTensor / HSDP / FSDP1 ShardedTensor rank files) and Megatron actor.

Fixtures come from sample_ckpts/make_verl_samples.py (FSDP2 / FSDP1 on gloo ranks, saved the way
verl's checkpoint manager saves). Ground truth is torch's own: ``DTensor.full_tensor()`` /
FSDP1 ``FULL_STATE_DICT`` saved by the generator, ``torch.chunk`` for the expected shard sizes,
``torch.load`` of each rank file for the local tensors, and ``dcp.load`` for the Megatron case.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from dist_reference import MEGATRON_ITER, SAMPLES, assert_no_torch_on_metadata_path, torch_dcp_tensors, values

from ckptscope.core.errors import CkptError
from ckptscope.formats import open_checkpoint
from ckptscope.formats.registry import detect_format
from ckptscope.formats.verl.reader import VerlFsdpReader, VerlMegatronReader, fsdp_layout, verl_complete

VERL_RUN = SAMPLES / "verl_run"
ACTOR = VERL_RUN / "global_step_2" / "actor"
EMBED = "model.embed_tokens.weight"


def verl_generators():
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_verl_samples")


def load_oracle(run: Path) -> dict[str, np.ndarray]:
    import torch

    full = torch.load(verl_generators().oracle_path(run), weights_only=True)
    return {k: v.detach().numpy() for k, v in full.items()}


def chunk_rows(rows: int, pieces: int) -> list[int]:
    import torch

    return [len(c) for c in torch.arange(rows).chunk(pieces)]


def assert_bitwise_equal(reader, oracle: dict[str, np.ndarray]) -> None:
    index = reader.index()
    assert set(index.tensors) == set(oracle)
    for name, want in oracle.items():
        assert index.tensors[name].shape == want.shape, name
        got = reader.read(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A fresh FSDP2 run (2 gloo ranks) with its gathered full state dict."""
    return verl_generators().write_verl_run(tmp_path_factory.mktemp("verl"), oracle=True)


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> tuple[Path, Path]:
    """HSDP (2x2 mesh) and FSDP1 ShardedTensor runs from one group of 4 gloo ranks."""
    return verl_generators().write_verl_hsdp_and_fsdp1(tmp_path_factory.mktemp("verl_variants"), oracle=True)


def actor_of(run: Path) -> Path:
    return run / "global_step_2" / "actor"


# --- FSDP2, the shipped sample ------------------------------------------------------------------


def test_shipped_sample_layout():
    assert detect_format(ACTOR) is VerlFsdpReader
    assert (VERL_RUN / "latest_checkpointed_iteration.txt").read_text() == "2"
    with open_checkpoint(ACTOR) as reader:
        index = reader.index()
    assert index.format == "verl_fsdp" and index.iteration == 2
    assert index.metadata["verl"] == {"backend": "fsdp", "world_size": 2, "world_size_from": "fsdp_config.json",
                                      "fsdp_version": 2, "role": "actor"}
    assert index.warnings == []
    roles = {f.path: f.role for f in index.files}
    assert roles["model_world_size_2_rank_0.pt"] == roles["model_world_size_2_rank_1.pt"] == "data"
    assert roles["optim_world_size_2_rank_1.pt"] == "optimizer"
    assert roles["extra_state_world_size_2_rank_0.pt"] == "extra_state"
    assert roles["huggingface/config.json"] == "config" and roles["huggingface/tokenizer.json"] == "tokenizer"
    for info in index.files:
        assert info.size == (ACTOR / info.path).stat().st_size
    objects = {o.name: o for o in index.objects}
    config = json.loads((ACTOR / "huggingface" / "config.json").read_text())
    assert objects["huggingface.config"].value == config
    assert index.metadata["model_type"] == config["model_type"]
    assert objects["fsdp_config"].value == json.loads((ACTOR / "fsdp_config.json").read_text())
    optim = objects["optim"].value
    assert optim["bytes"] == sum(p.stat().st_size for p in ACTOR.glob("optim_world_size_2_rank_*.pt"))
    import torch

    extra = torch.load(ACTOR / "extra_state_world_size_2_rank_0.pt", weights_only=False)
    assert objects["extra_state.lr_scheduler"].value["last_epoch"] == extra["lr_scheduler"]["last_epoch"]
    assert {"cpu", "numpy", "random"} <= set(objects["extra_state.rng"].value)


def test_values_match_full_tensor_oracle(fresh):
    with open_checkpoint(actor_of(fresh)) as reader:
        assert_bitwise_equal(reader, load_oracle(fresh))


def test_shipped_sample_matches_a_fresh_run(fresh):
    """The writer is deterministic, so the shipped files hold the values torch gathered for the fresh run."""
    with open_checkpoint(ACTOR) as reader:
        assert_bitwise_equal(reader, load_oracle(fresh))


def test_uneven_shards_follow_torch_chunk():
    with open_checkpoint(ACTOR) as reader:
        meta = reader.meta(EMBED)
        rows = meta.shape[0]
        assert rows % 2 == 1
        sizes = chunk_rows(rows, 2)
        assert [c.shape[0] for c in meta.chunks] == sizes
        assert [c.offsets for c in meta.chunks] == [(0, 0), (sizes[0], 0)]
        assert [c.file for c in meta.chunks] == [f"model_world_size_2_rank_{r}.pt" for r in range(2)]
        assert dict(meta.attrs)["placements"] == "(Shard(0))" and dict(meta.attrs)["mesh"] == "fsdp=2"


def test_chunks_hold_each_ranks_local_tensor():
    """torch.load of every rank file (no process group needed for DTensor): each local tensor is
    exactly the region of the global tensor its chunk claims."""
    import torch
    import torch.distributed.tensor  # registers DTensor for unpickling

    with open_checkpoint(ACTOR) as reader:
        index = reader.index()
        for rank in range(2):
            state = torch.load(ACTOR / f"model_world_size_2_rank_{rank}.pt", weights_only=False)
            assert set(state) == set(index.tensors)
            for name, dtensor in state.items():
                local = dtensor._local_tensor
                chunk = next(c for c in index.tensors[name].chunks if c.file.endswith(f"rank_{rank}.pt"))
                assert chunk.shape == tuple(local.shape)
                box = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.shape))
                assert reader.read(name, box).tobytes() == local.numpy().tobytes(), (name, rank)
                assert dtensor.shape == index.tensors[name].shape


def test_missing_rank_file_is_a_warning_and_a_read_error(tmp_path, cli):
    actor = tmp_path / "actor"
    shutil.copytree(ACTOR, actor)
    (actor / "model_world_size_2_rank_1.pt").unlink()
    assert verl_complete(actor) is False and verl_complete(ACTOR) is True
    with open_checkpoint(ACTOR) as whole, open_checkpoint(actor) as reader:
        index = reader.index()
        assert any(w.startswith("model_world_size_2_rank_1.pt: missing") for w in index.warnings)
        assert index.tensors[EMBED].shape == whole.meta(EMBED).shape
        assert dict(index.tensors[EMBED].attrs)["missing"] == "model_world_size_2_rank_1.pt"
        top = chunk_rows(whole.meta(EMBED).shape[0], 2)[0]
        np.testing.assert_array_equal(reader.read(EMBED, (slice(0, top),)), whole.read(EMBED, (slice(0, top),)))
        with pytest.raises(CkptError, match="model_world_size_2_rank_1.pt, which is missing"):
            reader.read(EMBED)
    result = cli("inspect", str(actor))
    assert result.code == 0
    assert "model_world_size_2_rank_1.pt: missing" in result.err


def test_old_verl_without_fsdp_config(tmp_path):
    actor = tmp_path / "global_step_7" / "actor"
    shutil.copytree(ACTOR, actor)
    (actor / "fsdp_config.json").unlink()
    layout = fsdp_layout(actor)
    assert layout is not None and layout.world_size == 2 and layout.source == "file names"
    with open_checkpoint(actor) as reader, open_checkpoint(ACTOR) as shipped:
        index = reader.index()
        assert index.iteration == 7 and index.metadata["verl"]["fsdp_version"] is None
        for name in shipped.index().tensors:
            assert reader.read(name).tobytes() == shipped.read(name).tobytes()


def test_truncated_rank_file_is_one_line_error(tmp_path, cli):
    actor = tmp_path / "actor"
    shutil.copytree(ACTOR, actor)
    rank0 = actor / "model_world_size_2_rank_0.pt"
    rank0.write_bytes(rank0.read_bytes()[:500])
    result = cli("inspect", str(actor))
    assert result.code == 2
    assert result.err.count("\n") == 1 and "model_world_size_2_rank_0.pt" in result.err
    assert "Traceback" not in result.err


def test_inspect_json(cli):
    result = cli("inspect", str(ACTOR), "--json")
    assert result.code == 0
    doc = json.loads(result.out)
    assert doc["format"] == "verl_fsdp" and doc["metadata"]["iteration"] == 2
    embed = next(t for t in doc["tensors"] if t["name"] == EMBED)
    assert [c["file"] for c in embed["chunks"]] == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    assert {"fsdp_config", "optim", "extra_state", "huggingface.config"} <= {o["name"] for o in doc["objects"]}


def test_index_and_read_import_no_torch():
    assert_no_torch_on_metadata_path(ACTOR, read=EMBED)


# --- HSDP and FSDP1 -------------------------------------------------------------------------------


def test_hsdp_replicas_are_read_once(variants):
    hsdp, _ = variants
    actor = actor_of(hsdp)
    with open_checkpoint(actor) as reader:
        assert_bitwise_equal(reader, load_oracle(hsdp))
        meta = reader.meta(EMBED)
        attrs = dict(meta.attrs)
        assert attrs["placements"] == "(Replicate(), Shard(0))" and attrs["mesh"] == "ddp=2, fsdp=2"
        assert "2x" in attrs["copies"]
        # the fsdp dim splits rows like torch.chunk; the ddp replica group (ranks 2, 3) is not read
        assert [c.shape[0] for c in meta.chunks] == chunk_rows(meta.shape[0], 2)
        assert [c.file for c in meta.chunks] == ["model_world_size_4_rank_0.pt", "model_world_size_4_rank_1.pt"]


def test_hsdp_missing_replica_costs_nothing(variants, tmp_path):
    hsdp, _ = variants
    actor = tmp_path / "actor"
    shutil.copytree(actor_of(hsdp), actor)
    (actor / "model_world_size_4_rank_3.pt").unlink()  # its shard is also on rank 1
    with open_checkpoint(actor) as reader:
        index = reader.index()
        assert any("model_world_size_4_rank_3.pt: missing" in w for w in index.warnings)
        assert not any("lack the shards" in w for w in index.warnings)
        assert_bitwise_equal(reader, load_oracle(hsdp))


def test_fsdp1_sharded_tensors(variants):
    _, fsdp1 = variants
    actor = actor_of(fsdp1)
    with open_checkpoint(actor) as reader:
        index = reader.index()
        assert index.metadata["verl"]["fsdp_version"] == 1
        assert_bitwise_equal(reader, load_oracle(fsdp1))
        meta = reader.meta(EMBED)
        assert dict(meta.attrs)["kind"] == "ShardedTensor"
        assert [c.shape[0] for c in meta.chunks] == chunk_rows(meta.shape[0], 4)
    assert_no_torch_on_metadata_path(actor, read=EMBED)


# --- Megatron backend -----------------------------------------------------------------------------


def test_megatron_actor_delegates_to_torch_dist(tmp_path):
    """The pre-v2 layout; the v2 one (``model/dist_ckpt/`` + ``ckpt_contents.json``) is test_verl_v2.py."""
    actor = verl_generators().write_verl_megatron_actor(tmp_path, MEGATRON_ITER)
    prefix = ""
    assert detect_format(actor) is VerlMegatronReader
    assert verl_complete(actor) is True
    expected = torch_dcp_tensors(MEGATRON_ITER)
    with open_checkpoint(actor) as reader:
        index = reader.index()
        assert index.format == "verl_megatron"
        assert index.metadata["verl"]["dist_ckpt"] == f"{prefix}dist_ckpt"
        assert set(index.tensors) == set(expected)
        for name, want in expected.items():
            np.testing.assert_array_equal(values(reader.read(name)), want, err_msg=name)
            assert all(c.file.startswith(f"{prefix}dist_ckpt/") for c in index.tensors[name].chunks)
        layer1 = reader.read("decoder.layers.1.mlp.linear_fc1.weight")
        np.testing.assert_array_equal(values(layer1), expected["decoder.layers.mlp.linear_fc1.weight"][1])
        objects = {o.name: o.value for o in index.objects}
        hf = f"{prefix}huggingface"
        assert objects[f"{hf}.config"] == json.loads((actor / hf / "config.json").read_text())
        assert objects["transformer_config"] == json.loads((actor / "transformer_config.json").read_text())
        assert {"args", "iteration"} <= set(objects)  # from Megatron's common.pt
        assert f"{hf}/tokenizer.json" in {f.path for f in index.files}
    assert_no_torch_on_metadata_path(actor, read="decoder.layers.1.mlp.linear_fc1.weight")


def test_megatron_actor_without_marker_is_incomplete(tmp_path):
    actor = verl_generators().write_verl_megatron_actor(tmp_path, MEGATRON_ITER)
    (actor / "dist_ckpt" / "metadata.json").unlink()
    assert verl_complete(actor) is False
    with pytest.raises(CkptError, match="incomplete save"):
        open_checkpoint(actor).index()


def test_tied_model_counts_its_embedding_once_and_exports_one(tmp_path, cli):
    """FSDP2 run of a model whose config (``huggingface/config.json``) ties the embeddings: the rank files
    hold ``lm_head.weight`` and the embedding, one parameter under two names. inspect counted it twice
    (a probe: 18,912 parameters where ``model.parameters()`` gives 17,280); the export is one tied model
    transformers loads with nothing missing, its logits those of the trained model."""
    import torch
    from transformers import AutoModelForCausalLM

    run = verl_generators().write_verl_tied(tmp_path / "gen", oracle=True)
    oracle = load_oracle(run)
    assert oracle["lm_head.weight"].tobytes() == oracle[EMBED].tobytes()
    model = verl_generators()._tiny_model(tied=True)
    want_params = sum(p.numel() for p in model.parameters())
    result = cli("inspect", "--json", str(actor_of(run)))
    assert result.code == 0, result.err
    assert json.loads(result.out)["metadata"]["num_params"] == want_params
    out = tmp_path / "hf"
    assert cli("convert", str(actor_of(run)), "--to", "hf", str(out)).code == 0
    loaded, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not any(info.values()), info
    model.load_state_dict({k: torch.from_numpy(v) for k, v in oracle.items()})
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_two_whole_world_size_sets_without_fsdp_config_are_ambiguous(tmp_path, cli):
    """Old verl (no fsdp_config.json) with a rerun at another world size into the same dir: a probe's dir
    held a newer W=2 set beside a W=3 one, and convert exported the stale W=3 set with exit 0 (check: ok).
    Nothing records which set is the save: check lists it, exports refuse; fsdp_config.json settles it."""
    actor = tmp_path / "global_step_2" / "actor"
    shutil.copytree(ACTOR, actor)
    shutil.copy(actor / "model_world_size_2_rank_0.pt", actor / "model_world_size_1_rank_0.pt")
    result = cli("check", str(actor))
    assert result.code == 0 and "ok" in result.out, result.out  # fsdp_config.json says world size 2
    (actor / "fsdp_config.json").unlink()
    result = cli("check", str(actor))
    assert result.code == 1 and "ambiguous-files" in result.out and "world sizes 1 and 2" in result.out, result.out
    converted = cli("convert", str(actor), "--to", "hf", str(tmp_path / "hf"))
    assert converted.code == 2 and "world sizes 1 and 2" in converted.err and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kept", ["hf_model", "optimizer+hf_model"])
def test_a_save_of_the_hf_model_only_is_that_model(fresh, tmp_path, cli, kept):
    """verl's ``checkpoint.save_contents=["hf_model"]``: no rank file, ``fsdp_config.json`` and the whole
    model written by ``save_pretrained`` (from the gathered state dict) into ``huggingface/``. It was an FSDP
    dir missing every rank file: convert said damaged, the run root had no complete iteration (a probe).
    With ``optimizer`` kept too, its rank files are listed beside the model (a reviewer: 'incomplete')."""
    import torch
    from transformers import AutoModelForCausalLM

    root = tmp_path / "run"
    actor = root / "global_step_2" / "actor"
    shutil.copytree(actor_of(fresh), actor)
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    for rank_file in actor.glob("*_world_size_*_rank_*.pt"):
        if kept == "hf_model" or rank_file.name.startswith("model_"):
            rank_file.unlink()
    oracle = load_oracle(fresh)
    model = verl_generators()._tiny_model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in oracle.items()})
    model.save_pretrained(actor / "huggingface")
    shown = cli("inspect", str(root))
    assert shown.code == 0 and "verl actor (FSDP, HF model only, step 2)" in shown.out, shown.out + shown.err
    assert "missing" not in shown.err
    checked = cli("check", str(root))
    assert checked.code == 0, checked.out
    out = tmp_path / "hf"
    assert cli("convert", str(root), "--to", "hf", str(out)).code == 0
    loaded, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not any(info.values()), info
    for name, value in loaded.state_dict().items():
        assert value.numpy().tobytes() == oracle[name].tobytes(), name


def test_megatron_actor_migrated_by_verls_script_is_whole(tmp_path, cli):
    """verl's docs tell users to run its migration script on pre-v2 saves. It mirrors the old mixed
    ``dist_ckpt/`` into ``model/``, ``optimizer/`` and ``extra/`` and writes no ``ckpt_contents.json``:
    check called the save unfinished, the run root had no complete iteration, and inspect read the mirror
    three times (52 'also in an earlier part' warnings in a probe). Read once, it is the old tree."""
    actor = verl_generators().write_verl_megatron_actor(tmp_path / "before", MEGATRON_ITER)
    migrated = tmp_path / "after" / "global_step_2" / "actor"
    shutil.copytree(actor.parent.parent, migrated.parent.parent)
    verl_generators().migrate_like_verl(migrated)
    assert verl_complete(migrated) is True
    with open_checkpoint(actor) as old, open_checkpoint(migrated) as new:
        index = new.index()
        assert index.metadata["verl"]["migrated"] and not index.issues and not index.warnings, index.warnings
        assert set(index.tensors) == set(old.index().tensors)
        for name in old.index().tensors:
            assert new.read(name).tobytes() == old.read(name).tobytes(), name
    root = migrated.parent.parent
    checked = cli("check", str(root))
    assert checked.code == 0, checked.out
    shown = cli("inspect", str(root))
    assert shown.code == 0 and "1 iteration (1 complete)" in " ".join(shown.out.split()), shown.out + shown.err
