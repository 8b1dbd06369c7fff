"""``ckptscope convert --to hf`` / ``merge``: real Megatron-Core and FSDP sources, outputs checked
with transformers and the safetensors library (not with ckptscope's reader)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SAMPLES = Path(__file__).resolve().parents[1] / "sample_ckpts"
HF = SAMPLES / "hf_llama_gqa"
MCORE = SAMPLES / "mcore_llama_gqa"


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _hashes(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()}


def test_megatron_to_hf_equals_the_original_hf_model(tmp_path, cli):
    before = _hashes(MCORE)
    out = tmp_path / "hf"
    result = cli("convert", str(MCORE), str(out), "--to", "hf", "--hf-config", str(HF))
    assert result.code == 0, result.err
    got, want = _load_dir(out), _load_dir(HF)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    assert _hashes(MCORE) == before


def test_megatron_to_hf_loads_in_transformers_with_equal_logits(tmp_path, cli):
    from tests.mcore_reference import hf_logits

    out = tmp_path / "hf"
    assert cli("convert", str(MCORE), str(out), "--to", "hf").code == 0  # config derived from the args
    config = json.loads((out / "config.json").read_text())
    original = json.loads((HF / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings"):
        assert config[key] == original[key], key
    tokens = torch.arange(12).reshape(2, 6) % 250
    assert torch.allclose(hf_logits(out, tokens), hf_logits(HF, tokens), atol=1e-5, rtol=0)


def test_shards_and_index(tmp_path, cli):
    out = tmp_path / "hf"
    assert cli("convert", str(MCORE), str(out), "--to", "hf", "--max-shard-size", "100KB").code == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) >= 3
    for shard in shards:
        assert shard.stat().st_size <= 100_000 + 70_000  # a shard closes before exceeding, unless one tensor is bigger
        for name in load_file(str(shard)):
            assert index["weight_map"][name] == shard.name
    assert set(index["weight_map"]) == set(_load_dir(HF))
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in _load_dir(out).values())


def test_dtype_cast_is_explicit(tmp_path, cli):
    out = tmp_path / "hf"
    assert cli("convert", str(MCORE), str(out), "--to", "hf", "--dtype", "bfloat16").code == 0
    got, want = _load_dir(out), _load_dir(HF)
    for name in want:
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], want[name].to(torch.bfloat16)), name
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"


def test_a_cast_is_what_transformers_loads(tmp_path, cli):
    """HF's own config (transformers 5 writes ``"dtype": "float32"``) cast to bf16: transformers
    must load the bf16 weights as bf16, not as the float32 the copied config said."""
    from transformers import AutoModelForCausalLM

    assert json.loads((HF / "config.json").read_text())["dtype"] == "float32"
    out = tmp_path / "hf"
    assert cli("convert", str(HF), str(out), "--to", "hf", "--dtype", "bfloat16").code == 0
    model, info = AutoModelForCausalLM.from_pretrained(out, dtype="auto", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_dry_run_lists_sources_and_writes_nothing(tmp_path, cli):
    out = tmp_path / "hf"
    result = cli("convert", str(MCORE), str(out), "--to", "hf", "--dry-run", "--json")
    assert result.code == 0 and not out.exists()
    plan = json.loads(result.out)
    by = {t["name"]: t for t in plan["tensors"]}
    k = by["model.layers.0.self_attn.k_proj.weight"]
    assert k["transforms"] == ["qkv"] and len(k["sources"]) == 2  # one row block per KV group
    assert by["model.embed_tokens.weight"]["transforms"] == ["vocab"]
    text = cli("convert", str(MCORE), str(out), "--to", "hf", "--dry-run")
    assert "model.layers.1.mlp.up_proj.weight" in text.out and "gate_up" in text.out and not out.exists()


def test_errors_are_one_line_exit_2(tmp_path, cli):
    out = tmp_path / "hf"
    out.mkdir()
    exists = cli("convert", str(MCORE), str(out), "--to", "hf")
    assert exists.code == 2 and "exists" in exists.err and exists.err.count("\n") == 1
    # An nn.Sequential's names (model.0.weight) are no HF model: refused, never written under a config.
    not_hf = cli("merge", str(SAMPLES / "dcp_fsdp2"), str(tmp_path / "x"))
    assert not_hf.code == 2 and "no mapping" in not_hf.err and not_hf.err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    bad = cli("convert", str(MCORE), str(tmp_path / "y"), "--to", "hf", "--tp", "2")
    assert bad.code == 2


@pytest.mark.skipif(not (SAMPLES / "verl_run").is_dir(), reason="verl sample not generated")
def test_merge_verl_fsdp_actor_is_bitwise_and_keeps_dtypes(tmp_path, cli):
    actor = SAMPLES / "verl_run" / "global_step_2" / "actor"
    out = tmp_path / "merged"
    result = cli("merge", str(actor), str(out))
    assert result.code == 0, result.err
    merged = _load_dir(out)
    # Independent oracle: torch.load the rank files and concatenate each DTensor's local shards.
    ranks = [torch.load(actor / f"model_world_size_2_rank_{r}.pt", weights_only=False) for r in range(2)]
    assert set(merged) == set(ranks[0])
    for name, value in ranks[0].items():
        if hasattr(value, "placements") and value.placements[0].is_shard():
            dim = value.placements[0].dim
            full = torch.cat([ranks[r][name].to_local() for r in range(2)], dim=dim)
        else:
            full = value.to_local() if hasattr(value, "to_local") else value
        assert merged[name].dtype == full.dtype and torch.equal(merged[name], full), name
    assert (out / "config.json").is_file() and (out / "generation_config.json").is_file()


@pytest.mark.skipif(not (SAMPLES / "verl_run").is_dir(), reason="verl sample not generated")
def test_merge_copies_each_rank_row_block_file_to_file(tmp_path):
    """FSDP shards of a parameter are contiguous byte runs of the rank files: merge copies them in
    the kernel instead of assembling the tensor in memory. The runs, read back in order, are the
    bytes torch's own loader finds in each rank's local shard."""
    from ckptscope.ops.convert.plan import plan_convert
    from ckptscope.ops.convert.streaming import file_runs

    actor = SAMPLES / "verl_run" / "global_step_2" / "actor"
    plan = plan_convert(actor, tmp_path / "out", to="hf")
    ranks = [torch.load(actor / f"model_world_size_2_rank_{r}.pt", weights_only=False) for r in range(2)]
    sharded = 0
    for tensor in plan.tensors:
        value = ranks[0][tensor.name]
        if not (hasattr(value, "placements") and value.placements[0].is_shard() and value.placements[0].dim == 0):
            continue
        runs = file_runs(plan, tensor)
        assert runs is not None and len(runs) == 2, tensor.name
        data = b"".join(path.read_bytes()[offset:offset + length] for path, offset, length in runs)
        expected = b"".join(ranks[r][tensor.name].to_local().contiguous().numpy().tobytes() for r in range(2))
        assert data == expected, tensor.name
        sharded += 1
    plan.reader.close()
    assert sharded >= 3


def test_to_torch_dist_needs_no_torch_and_every_item_is_a_valid_zip(tmp_path):
    """The torch_dist writer is torch-free (containers, .metadata, common.pt); each item it wrote,
    tensors copied file to file included, is a zip whose CRCs check out, and torch loads it."""
    import io
    import subprocess
    import sys
    import zipfile

    from ckptscope.formats.dcp.metadata import load_dcp_metadata

    dst = tmp_path / "mc"
    code = (
        "import sys\n"
        "from ckptscope.cli import main\n"
        "try:\n"
        f"    main(['convert', {str(HF)!r}, {str(dst)!r}, '--to', 'mcore'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    iter_dir = dst / "iter_0000000"
    metadata = load_dcp_metadata(iter_dir / ".metadata")
    places = [c.storage for t in metadata.tensors.values() for c in t.chunks]
    places += list(metadata.bytes_entries.values())
    assert len(places) > 20 and None not in places
    for where in places:
        with open(iter_dir / where.file, "rb") as handle:
            handle.seek(where.offset)
            item = handle.read(where.length)
        assert zipfile.ZipFile(io.BytesIO(item)).testzip() is None
        torch.load(io.BytesIO(item), weights_only=True)
    common = torch.load(iter_dir / "common.pt", weights_only=False)
    assert common["iteration"] == 0 and common["checkpoint_version"] == 3.0 and common["args"].num_layers > 0


@pytest.mark.parametrize("config_class", ["GemmaConfig", "GraniteConfig"])
def test_an_architecture_without_a_mapping_is_refused_not_guessed(tmp_path, cli, config_class):
    """Gemma (GeGLU, scaled embeddings) and Granite (scaling multipliers) store Llama's tensor names:
    guessed from the names they converted as Llama and computed something else. Their config.json's
    model_type has no mapping: one line, exit 2, nothing written."""
    import transformers

    config = getattr(transformers, config_class)(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=250,
                                                 head_dim=16)
    model = transformers.AutoModelForCausalLM.from_config(config)
    src = tmp_path / "src"
    model.save_pretrained(src)
    result = cli("convert", str(src), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 2 and f"model_type {config.model_type!r}" in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and not (tmp_path / "mcore").exists()


@pytest.mark.parametrize("hidden_act, refused", [("gelu", False), ("gelu_pytorch_tanh", True)])
def test_a_gelu_gated_llama_keeps_its_activation_or_is_refused(tmp_path, cli, hidden_act, refused):
    """Megatron's gated fc1 without --swiglu applies its default GELU, the exact one (HF "gelu"): that
    converts both ways and comes back as "gelu" (it came back as "silu", another model). An
    activation Megatron would not compute (the tanh approximation) is refused."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      hidden_act=hidden_act)
    torch.manual_seed(0)
    src = tmp_path / "src"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(src)
    mcore, back = tmp_path / "mcore", tmp_path / "back"
    result = cli("convert", str(src), str(mcore), "--to", "mcore")
    if refused:
        assert result.code == 2 and hidden_act in result.err and not mcore.exists(), result.err
        return
    assert result.code == 0, result.err
    assert cli("convert", str(mcore), str(back), "--to", "hf").code == 0
    assert json.loads((back / "config.json").read_text())["hidden_act"] == "gelu"
    tokens = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(src)(tokens).logits
        got = transformers.AutoModelForCausalLM.from_pretrained(back)(tokens).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize("window, written", [(4, [3, 0]), (None, None), (4096, None)])
def test_mistral_sliding_window_is_written_where_it_applies(tmp_path, cli, window, written):
    """A window shorter than the model's positions changes what attention sees: it becomes Megatron's
    window_size (W - 1 before, 0 after; tests/test_sliding_window.py runs megatron-core on it); no
    window, or one as long as the positions, writes none."""
    import transformers

    from tests.mcore_reference import common_state, iteration_dir

    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                        sliding_window=window, max_position_embeddings=4096)
    src = tmp_path / "src"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(src)
    result = cli("convert", str(src), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 0, result.err
    args = common_state(iteration_dir(tmp_path / "mcore"))["args"]
    assert (list(args.window_size) if getattr(args, "window_size", None) else None) == written


def test_a_megatron_sliding_window_is_not_exported_as_full_attention(tmp_path, cli):
    """Megatron args with window_size (the sample's own args, re-saved by torch with that field set) and
    no arch that spells a window: refused, with the archs that would carry it."""
    import shutil

    from dist_reference import MEGATRON_ITER

    iteration = tmp_path / "iter_0000010"
    shutil.copytree(MEGATRON_ITER, iteration)
    common = torch.load(iteration / "common.pt", weights_only=False)
    common["args"].window_size = (3, 0)
    torch.save(common, iteration / "common.pt")
    result = cli("convert", str(iteration), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and "window_size" in result.err and not (tmp_path / "hf").exists(), result.err
    assert "--arch mistral" in result.err
    result = cli("convert", str(iteration), str(tmp_path / "hf"), "--to", "hf", "--arch", "mistral")
    assert result.code == 0, result.err
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (written["model_type"], written["sliding_window"]) == ("mistral", 4)


def test_a_tied_config_never_drops_a_stored_lm_head_that_differs(tmp_path, cli):
    """An FSDP / DCP / Trainer save keeps ``lm_head.weight`` beside the embedding (a copy when tied). With a
    config that says tied, convert dropped it on the flag alone: a probe's FSDP2 model whose lm_head was
    trained apart exported with logits off by 0.6, exit 0. Now a differing copy is refused (as it was for
    Megatron sources); an equal copy (what FSDP's full state dict of a tied model holds) is still dropped."""
    from safetensors.torch import load_file, save_file

    tied_config = tmp_path / "tied"
    tied_config.mkdir()
    config = json.loads((HF / "config.json").read_text())
    (tied_config / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    result = cli("convert", str(HF), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(tied_config))
    assert result.code == 2 and "stores an lm_head.weight of its own" in result.err, result.err
    assert not (tmp_path / "out").exists()
    # to Megatron too (a reviewer: its shared embedding dropped the trained lm_head, exit 0)
    tied_src = tmp_path / "tied_src"
    shutil.copytree(HF, tied_src)
    (tied_src / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    result = cli("convert", str(tied_src), str(tmp_path / "mc"), "--to", "mcore")
    assert result.code == 2 and "stores an lm_head.weight of its own" in result.err, result.err
    assert not (tmp_path / "mc").exists()
    copy = tmp_path / "copy"
    copy.mkdir()
    weights = load_file(str(HF / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()  # FSDP's full state dict of a tie
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    (copy / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    result = cli("convert", str(copy), str(tmp_path / "out2"), "--to", "hf")
    assert result.code == 0, result.err
    assert "lm_head.weight" not in load_file(str(tmp_path / "out2" / "model.safetensors"))


def test_the_vocabulary_note_says_padding_only_when_rows_are_added(tmp_path, cli):
    """'vocabulary 256 padded to 256' read as if rows were added (a person testing the TUI form)."""
    def vocab_notes(src: Path, tp: int) -> list[str]:
        result = cli("convert", str(src), str(tmp_path / "x"), "--to", "mcore", "--tp", str(tp), "--dry-run", "--json")
        assert result.code == 0, result.err
        return [n for n in json.loads(result.out)["notes"] if n.startswith("vocabulary")]

    assert vocab_notes(HF, 1) == ["vocabulary 250 padded to 256 rows"]
    assert vocab_notes(SAMPLES / "hf_llama_single", 2) == ["vocabulary 256: a multiple of 128 x TP 2, no padding rows"]
