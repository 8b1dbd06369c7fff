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
