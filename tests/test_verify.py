"""``verify`` and TP/PP conversions for every dense architecture: HF -> Megatron-Core -> HF is bit
exact at TP in {1, 2} and PP in {1, 2}, in torch_dist and per-rank torch format. HF inputs are
written by transformers (make_mcore_pair_samples.py)."""

from __future__ import annotations

import json

import pytest

from ckptscope.ops.verify import verify_round_trip
from tests.conftest import load_sample_module

LAYOUTS = [(1, 1, "torch_dist"), (2, 2, "torch_dist"), (2, 1, "torch"), (1, 2, "torch"), (2, 2, "torch")]


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    pairs = load_sample_module("make_mcore_pair_samples")
    out = tmp_path_factory.mktemp("hf")
    return {name: pairs.write_hf(name, out / name) for name in ("llama_gqa", "qwen2_tied", "qwen3")}


@pytest.mark.parametrize("arch", ["llama_gqa", "qwen2_tied", "qwen3"])
@pytest.mark.parametrize("tp,pp,fmt", LAYOUTS)
def test_round_trip_is_bit_exact(hf_models, arch, tp, pp, fmt):
    report = verify_round_trip(hf_models[arch], via="mcore", tp=tp, pp=pp, ckpt_format=fmt)
    summary = report.summary()
    assert report.identical, [r.to_json() for r in report.results if r.differs]
    assert summary["only_a"] == summary["only_b"] == 0  # P7: lm_head present iff the source had it
    assert summary["equal"] == summary["compared"] > 10


def test_verify_cli_exit_code_and_json(hf_models, cli):
    result = cli("verify", str(hf_models["qwen2_tied"]), "--tp", "2", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["identical"] and "tp 2" in data["b"]
    bad = cli("verify", str(hf_models["qwen2_tied"]) + "-missing")
    assert bad.code == 2 and bad.err.count("\n") == 1


def test_megatron_side_round_trip(tmp_path):
    from pathlib import Path

    mcore = Path(__file__).resolve().parents[1] / "sample_ckpts" / "mcore_llama_gqa"
    report = verify_round_trip(mcore, via="hf")
    # 9 tensors, plus the real-vocabulary rows of the two padded vocab tensors as pairs of their own
    assert report.identical and report.summary()["compared"] == 9 + 2


SAMPLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "sample_ckpts"


def test_a_megatron_source_goes_through_hf_by_default(cli):
    """A Megatron source went mcore -> mcore -> hf by default (a reshard and an export, not a round trip),
    which stopped with exit 2 on a save without the true vocab size; the Megatron options shape the
    Megatron leg whichever way it runs."""
    result = cli("verify", str(SAMPLES / "megatron_torch_dist"), "--json")
    assert result.code == 0, result.err
    # back at the save's own TP (its args say 2), so the vocabulary is padded as it was
    assert json.loads(result.out)["b"].endswith("-> hf -> mcore (tp 2, pp 1, torch_dist)")
    hf = cli("verify", str(SAMPLES / "hf_llama_gqa"), "--tp", "2", "--json")
    assert hf.code == 0 and json.loads(hf.out)["b"].endswith("-> mcore (tp 2, pp 1, torch_dist) -> hf"), hf.err


def test_verify_of_a_megatron_save_does_not_hide_its_padding_rows(cli):
    """A per-rank torch save's layers are spelled otherwise than the torch_dist the round trip writes
    (``input_layernorm`` / ``linear_qkv.layer_norm_weight``), so the diff paired them through HF names,
    which drop the vocab padding rows: verify said identical (exit 0) while its own output said the source's
    28 padding rows were not all zero and came back as zeros. Now the vocab tensor is compared whole
    under its Megatron name (different) and its real rows as a pair of their own (equal)."""
    result = cli("verify", str(SAMPLES / "megatron_legacy_tp2"), "--via", "hf", "--json")
    assert result.code == 1, result.err
    data = json.loads(result.out)
    status = {t["name"]: t["status"] for t in data["tensors"]}
    assert status["embedding.word_embeddings.weight"] == "different"
    assert status["embedding.word_embeddings.weight[:100]"] == "equal"
    assert [n for n, s in status.items() if s != "equal"] == ["embedding.word_embeddings.weight"], status
    assert any(n.startswith("only the vocab padding rows differ") for n in data["notes"]), data["notes"]
    # the source's TP (2) and make_vocab_size_divisible_by (64): padded to 128 rows again, not 256
    assert "(tp 2, pp 1, torch_dist)" in data["b"]


def test_megatron_saves_padded_to_other_sizes_still_pair_their_real_rows(tmp_path, cli):
    """TP=1 pads the vocabulary to 128 rows, TP=2 to 256: the whole tensors are a shape mismatch, and the
    real vocabulary's rows are still compared (no pair was added when the shapes differed)."""
    hf = tmp_path / "hf"
    assert cli("convert", str(SAMPLES / "megatron_legacy_tp2"), "--to", "hf", str(hf)).code == 0
    for tp in (1, 2):
        done = cli("convert", str(hf), "--to", "mcore", "--tp", str(tp), str(tmp_path / f"tp{tp}"))
        assert done.code == 0, done.err
    result = cli("diff", "--json", str(tmp_path / "tp1"), str(tmp_path / "tp2"))
    assert result.code == 1, result.err
    data = json.loads(result.out)
    status = {t["name"]: t["status"] for t in data["tensors"]}
    assert status["embedding.word_embeddings.weight"] == "shape_mismatch"
    assert status["embedding.word_embeddings.weight[:100]"] == "equal"
    assert any("rows 100-127 in A and 100-255 in B" in n for n in data["notes"]), data["notes"]


def test_verify_at_another_tp_says_the_padding_size_changed(cli):
    """--tp 4 on the way back pads the vocabulary to 512 rows where the source has 256: a shape mismatch of
    the whole vocab tensors, the real rows equal; the note says the padding size changed (it said the rows
    were written as zeros, a reviewer)."""
    result = cli("verify", str(SAMPLES / "mcore_llama_gqa"), "--tp", "4", "--json")
    data = json.loads(result.out)
    differing = {t["name"]: t["status"] for t in data["tensors"] if t["status"] != "equal"}
    assert result.code == 1 and set(differing.values()) == {"shape_mismatch"}, differing
    assert any("padded the vocabulary to another size" in n for n in data["notes"]), data["notes"]
