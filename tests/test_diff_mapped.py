"""Mapping-aware diff (``--map auto``) on a real HF checkpoint and its real Megatron-Core conversion.

``sample_ckpts/hf_llama_gqa`` is written by transformers; ``sample_ckpts/mcore_llama_gqa`` by
megatron-core ``dist_checkpointing.save`` from a GPTModel whose logits were checked against
transformers' (sample_ckpts/make_mcore_pair_samples.py), so the pair is right independently of
ckptscope's mapping layer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptscope.ops.diff.engine import diff_checkpoints
from ckptscope.ops.diff.plan import plan_diff

SAMPLES = Path(__file__).resolve().parents[1] / "sample_ckpts"
HF = SAMPLES / "hf_llama_gqa"
MCORE = SAMPLES / "mcore_llama_gqa"


def test_hf_and_its_megatron_conversion_are_identical(cli):
    result = cli("diff", str(HF), str(MCORE), "--json")
    assert result.code == 0, result.out[-2000:]
    data = json.loads(result.out)
    assert data["identical"] and data["summary"]["different"] == 0 and data["summary"]["only_a"] == 0
    assert data["mapping"] == "mcore->hf"
    by = {t["name"]: t for t in data["tensors"]}
    q = by["model.layers.1.self_attn.q_proj.weight"]
    assert q["a"] == "model.layers.1.self_attn.q_proj.weight"
    # B names the stacked torch_dist tensor, the layer and the q rows of each KV group.
    assert q["b"].startswith("decoder.layers.self_attention.linear_qkv.weight[1, ")
    assert q["b"].count("+") == 1  # 2 KV groups -> 2 row blocks
    pads = {p["source"]: p for p in data["padding"]}
    config = json.loads((HF / "config.json").read_text())
    emb = pads["embedding.word_embeddings.weight"]
    assert emb["rows"][0] == config["vocab_size"] and emb["all_zero"]


def test_without_mapping_nothing_pairs(cli):
    result = cli("diff", str(HF), str(MCORE), "--json", "--map", "none")
    assert result.code == 1
    assert json.loads(result.out)["summary"]["compared"] == 0


@pytest.mark.parametrize("tensor,row", [("self_attn.k_proj.weight", 13), ("self_attn.v_proj.weight", 3),
                                        ("self_attn.q_proj.weight", 40), ("mlp.up_proj.weight", 7),
                                        ("mlp.gate_proj.weight", 50)])
def test_one_perturbed_element_is_reported_at_its_hf_tensor(tmp_path, tensor, row):
    copy = tmp_path / "hf"
    shutil.copytree(HF, copy)
    state = load_file(str(copy / "model.safetensors"))
    name = f"model.layers.1.{tensor}"
    state[name][row, 5] += 0.5
    save_file(state, str(copy / "model.safetensors"), metadata={"format": "pt"})
    report = diff_checkpoints(plan_diff(MCORE, copy))
    differing = [r for r in report.results if r.differs]
    assert [r.name for r in differing] == [name]
    (result,) = differing
    assert result.metrics["num_diff"] == 1
    assert result.max_diff_at == (row, 5)
    assert result.metrics["max_abs_diff"] == pytest.approx(0.5, rel=1e-6)
    assert result.a.startswith("decoder.layers.")  # the fused/stacked Megatron source, described


def test_dtype_change_across_mapping_is_reported(tmp_path):
    copy = tmp_path / "hf"
    shutil.copytree(HF, copy)
    state = load_file(str(copy / "model.safetensors"))
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.bfloat16)
    save_file(state, str(copy / "model.safetensors"), metadata={"format": "pt"})
    report = diff_checkpoints(plan_diff(copy, MCORE))
    (result,) = [r for r in report.results if r.differs]
    assert result.name == "model.norm.weight" and result.status == "dtype_mismatch"


def test_megatron_vocab_padding_rows_get_a_pair_of_their_own(tmp_path, cli):
    """A Megatron checkpoint whose padding rows hold values (trained, or initialised) against the same
    model after a round trip through HF, which writes them back as zeros: the whole vocab tensors
    differ (exit 1), and ``<tensor>[:vocab_size]`` pairs show the real vocabulary is equal."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    hf = Path(__file__).resolve().parents[1] / "sample_ckpts" / "hf_llama_gqa"  # vocab 250
    zeros = tmp_path / "zeros"
    assert cli("convert", str(hf), str(zeros), "--to", "mcore", "--tp", "2").code == 0
    (a_iter,) = [p for p in zeros.iterdir() if p.is_dir()]
    trained = tmp_path / "trained" / a_iter.name
    trained.mkdir(parents=True)
    for name in ("common.pt", "metadata.json"):
        shutil.copy2(a_iter / name, trained / name)
    md = FileSystemReader(str(a_iter)).read_metadata()
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
             if isinstance(v, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=str(a_iter), no_dist=True)
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert state[name].shape[0] == 256 and not state[name][250:].any()
        state[name][250:] = torch.randn(6, state[name].shape[1], generator=torch.Generator().manual_seed(0))
    dcp.save(state, checkpoint_id=str(trained), no_dist=True)

    result = cli("diff", str(trained), str(a_iter), "--json")
    assert result.code == 1, result.err
    doc = json.loads(result.out)
    by = {t["name"]: t for t in doc["tensors"]}
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        assert by[name]["status"] == "different" and by[name]["max_diff_at"][0] >= 250
        assert by[name + "[:250]"]["status"] == "equal"
        assert any(note.startswith(name + ": rows 250-255 are vocab padding") for note in doc["notes"])
    assert all(t["status"] == "equal" for n, t in by.items() if not n.startswith(("embedding.", "output_layer.")))


def test_two_megatron_models_of_different_sizes_are_compared_each_with_its_own_config():
    """Two Megatron saves of different models (the shipped torch_dist and legacy TP=2 samples): each
    side's fused QKV is split with its own args. Before, A's config was applied to B and the diff
    stopped with "fused QKV has 64 rows but ... 128" naming neither side (exit 2)."""
    from tests.conftest import REPO, run_cli

    result = run_cli("diff", "--json", str(REPO / "sample_ckpts" / "megatron_torch_dist"),
                     str(REPO / "sample_ckpts" / "megatron_legacy_tp2"))
    assert result.code == 1, result.err
    report = json.loads(result.out)
    assert report["summary"]["different"] > 0 and report["summary"]["equal"] == 0
    assert any(t["status"] == "shape_mismatch" and t["name"] == "model.layers.0.self_attn.q_proj.weight"
               for t in report["tensors"]), [t["status"] for t in report["tensors"]][:5]


def test_a_filter_that_selects_nothing_is_said(cli, tmp_path):
    """A probe's --exclude of layer 1 by Megatron names, on an HF-vs-Megatron pair (whose pairs carry HF
    names), excluded nothing without a word; an --include of the same glob failed without saying which names
    the pairs have. Between two torch_dist saves (stacked stored names) the exclusion was ignored outright."""
    excluded = cli("diff", str(HF), str(MCORE), "--exclude", "decoder.layers.1.*", "--json")
    assert excluded.code == 0, excluded.err
    assert any("--exclude decoder.layers.1.* matched no tensor" in n and "HF names" in n
               for n in json.loads(excluded.out)["notes"])
    included = cli("diff", str(HF), str(MCORE), "--include", "decoder.layers.1.*", "--json")
    assert included.code == 2 and "HF names here" in included.err, included.err
    # two torch_dist saves whose layer 1 differs: the exclusion applies to the per-layer names
    changed = tmp_path / "hf_changed"
    shutil.copytree(HF, changed)
    shard = next(changed.glob("*.safetensors"))
    state = load_file(str(shard))
    name = next(n for n in state if n.startswith("model.layers.1.self_attn.q_proj"))
    state[name] = state[name] + 1
    save_file(state, str(shard), metadata={"format": "pt"})
    for src, dst in ((HF, "a"), (changed, "b")):
        assert cli("convert", str(src), "--to", "mcore", str(tmp_path / dst)).code == 0
    whole = cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert whole.code == 1, whole.err
    without_layer_1 = cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--exclude", "decoder.layers.1.*", "--json")
    assert without_layer_1.code == 0, without_layer_1.out
    assert not any(t["name"].startswith("decoder.layers.1.") for t in json.loads(without_layer_1.out)["tensors"])
    # with an --include that matches the stored (stacked) names as well (a reviewer: the exclusion was ignored)
    both = cli("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--include", "decoder.*",
               "--exclude", "decoder.layers.1.*", "--json")
    assert both.code == 0, both.out


def test_a_lossless_reshard_to_another_tp_is_identical(cli, tmp_path):
    """torch_dist at TP=1 (vocabulary padded to 128 rows) against per-rank torch at TP=2 (256 rows, local-spec
    names, so the pair goes through HF names): the real vocabulary is compared and the zero padding listed;
    the extra rows are no difference of the model."""
    hf = tmp_path / "hf"  # a vocabulary of 100: 128 rows at TP=1, 256 at TP=2
    assert cli("convert", str(SAMPLES / "megatron_legacy_tp2"), "--to", "hf", str(hf)).code == 0
    for args, dst in ((("--to", "mcore"), "tp1"), (("--to", "mcore", "--ckpt-format", "torch", "--tp", "2"), "tp2")):
        assert cli("convert", str(hf), str(tmp_path / dst), *args).code == 0
    result = cli("diff", str(tmp_path / "tp1"), str(tmp_path / "tp2"), "--json")
    assert result.code == 0, result.out
    report = json.loads(result.out)
    assert report["mapping"] == "mcore->hf" and report["identical"]
    assert report["padding"] and all(p["all_zero"] for p in report["padding"]), report["padding"]
    # trained padding rows against zeros at another padded size: a difference, named by the pair of the rows
    # both tables have (a reviewer: 'identical')
    tp4 = tmp_path / "tp4"
    assert cli("convert", str(hf), str(tp4), "--to", "mcore", "--tp", "4").code == 0
    trained = cli("diff", str(SAMPLES / "megatron_legacy_tp2"), str(tp4), "--json")
    assert trained.code == 1, trained.out
    status = {t["name"]: t["status"] for t in json.loads(trained.out)["tensors"] if t["status"] != "equal"}
    assert status == {"embedding.word_embeddings.weight[100:128]": "different"}, status

