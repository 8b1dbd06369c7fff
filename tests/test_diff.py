"""``ckptscope diff``: metrics against numpy, statuses, streaming blocks, exit codes and JSON.

Fixtures are written by safetensors' own torch writer; expected metrics are computed here with
numpy/torch directly from the tensors, never from ckptscope's reader.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptscope.ops.diff.engine import DiffOptions, diff_checkpoints
from ckptscope.ops.diff.plan import plan_diff

JSON_TENSOR_KEYS = {"name", "a", "b", "status", "max_abs_diff", "mean_abs_diff", "rel_l2", "cosine", "num_diff"}


def _expected(a: torch.Tensor, b: torch.Tensor) -> dict:
    x, y = a.double().numpy().ravel(), b.double().numpy().ravel()
    d = np.abs(x - y)
    differ = a.view(-1).view(torch.int32 if a.element_size() == 4 else torch.int16).numpy() != \
        b.view(-1).view(torch.int32 if b.element_size() == 4 else torch.int16).numpy() if a.dtype == b.dtype \
        else x != y
    return {
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "rel_l2": float(np.linalg.norm(x - y) / np.linalg.norm(x)),
        "cosine": float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))),
        "num_diff": int(np.count_nonzero(differ)),
        "argmax": tuple(int(i) for i in np.unravel_index(int(np.argmax(d)), tuple(a.shape))),
    }


@pytest.fixture
def pair(tmp_path):
    """Two single-file checkpoints with every kind of difference, plus the tensors themselves."""
    g = torch.Generator().manual_seed(0)
    base = {
        "same": torch.randn(64, 32, generator=g),
        "perturbed": torch.randn(128, 48, generator=g),
        "noisy": torch.randn(33, 17, generator=g),
        "bf16": torch.randn(40, 8, generator=g).to(torch.bfloat16),
        "recast": torch.randn(16, 16, generator=g),
        "reshaped": torch.randn(4, 6, generator=g),
        "gone": torch.randn(3, generator=g),
        "signed_zero": torch.zeros(5),
    }
    other = {k: v.clone() for k, v in base.items() if k != "gone"}
    other["perturbed"][77, 5] += 0.5
    other["perturbed"][3, 40] -= 0.25
    other["noisy"] += 1e-4 * torch.randn(33, 17, generator=g)
    other["bf16"][39, 7] = other["bf16"][39, 7] * 2
    other["recast"] = base["recast"].to(torch.bfloat16)
    other["reshaped"] = base["reshaped"].reshape(6, 4).clone()
    other["signed_zero"][2] = -0.0
    other["new"] = torch.ones(2)
    save_file(base, str(tmp_path / "a.safetensors"))
    save_file(other, str(tmp_path / "b.safetensors"))
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors", base, other


def _by_name(report):
    return {r.name: r for r in report.results}


def test_metrics_match_numpy(pair):
    a, b, base, other = pair
    report = diff_checkpoints(plan_diff(a, b))
    results = _by_name(report)
    for name in ("perturbed", "noisy", "bf16"):
        want = _expected(base[name], other[name])
        got = results[name]
        assert got.status == "different"
        for key in ("max_abs_diff", "mean_abs_diff", "rel_l2", "cosine"):
            assert got.metrics[key] == pytest.approx(want[key], rel=1e-9, abs=1e-15), (name, key)
        assert got.metrics["num_diff"] == want["num_diff"]
        assert got.max_diff_at == want["argmax"]
    assert results["perturbed"].metrics["num_diff"] == 2
    assert results["perturbed"].max_diff_at == (77, 5)
    assert results["same"].status == "equal" and results["same"].metrics["max_abs_diff"] == 0.0


def test_statuses_and_summary(pair):
    a, b, *_ = pair
    report = diff_checkpoints(plan_diff(a, b))
    results = _by_name(report)
    assert results["recast"].status == "dtype_mismatch"  # compared after upcast, never "equal"
    assert (results["recast"].dtype_a, results["recast"].dtype_b) == ("float32", "bfloat16")
    assert results["recast"].metrics["max_abs_diff"] > 0
    assert results["reshaped"].status == "shape_mismatch"
    assert results["reshaped"].metrics["max_abs_diff"] is None
    assert results["gone"].status == "only_a" and results["new"].status == "only_b"
    # -0.0 vs 0.0: bitwise different, numerically no distance.
    assert results["signed_zero"].status == "different"
    assert results["signed_zero"].metrics["num_diff"] == 1 and results["signed_zero"].metrics["max_abs_diff"] == 0.0
    summary = report.summary()
    assert summary["only_a"] == 1 and summary["only_b"] == 1 and summary["equal"] == 1
    assert summary["compared"] == 7
    assert summary["different"] == 6
    assert not report.identical


def test_a_dtype_change_is_never_identical(tmp_path):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)  # exactly representable in bf16
    save_file({"w": t}, str(tmp_path / "a.safetensors"))
    save_file({"w": t.to(torch.bfloat16)}, str(tmp_path / "b.safetensors"))
    report = diff_checkpoints(plan_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors"),
                              DiffOptions(atol=1.0))
    (result,) = report.results
    assert result.status == "dtype_mismatch" and result.metrics["num_diff"] == 0
    assert not report.identical


def test_tolerances_make_close(pair):
    a, b, base, other = pair
    report = diff_checkpoints(plan_diff(a, b, include=("noisy",)), DiffOptions(atol=1e-3))
    assert [r.status for r in report.results] == ["close"]
    report = diff_checkpoints(plan_diff(a, b, include=("noisy",)), DiffOptions(atol=1e-7))
    assert [r.status for r in report.results] == ["different"]
    assert report.results[0].metrics["num_diff"] == _expected(base["noisy"], other["noisy"])["num_diff"]


def test_small_blocks_and_threads_give_the_same_report(pair):
    a, b, *_ = pair
    whole = diff_checkpoints(plan_diff(a, b), DiffOptions(workers=1))
    tiny = diff_checkpoints(plan_diff(a, b), DiffOptions(workers=3, block_bytes=256))
    assert [r.to_json() for r in whole.results] == [r.to_json() for r in tiny.results]


def test_a_pair_that_differs_early_is_not_read_twice(tmp_path):
    """Once a block of a byte-compared pair differs, the rest of its byte comparison is skipped: the
    value path reads the pair whole anyway. The metrics are those of a full comparison."""
    base = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    other = base.clone()
    other[0, 0] += 1.0
    other[40, 7] -= 0.5
    save_file({"w": base}, str(tmp_path / "a.safetensors"))
    save_file({"w": other}, str(tmp_path / "b.safetensors"))
    plan = plan_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    report = diff_checkpoints(plan, DiffOptions(workers=1, block_bytes=1024))
    (result,) = report.results
    expected = _expected(base, other)
    assert result.status == "different" and result.metrics["num_diff"] == expected["num_diff"] == 2
    assert result.metrics["max_abs_diff"] == pytest.approx(expected["max_abs_diff"])
    assert result.max_diff_at == (0, 0)
    nbytes = base.numel() * 4
    # The value pass reads both sides once (2 * nbytes); the byte pass stopped after the units in flight.
    assert report.bytes_read <= 2 * nbytes + 4 * 1024


def test_nan_handling(tmp_path):
    x = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    y = torch.tensor([1.0, float("nan"), 3.5, float("nan")])
    save_file({"w": x}, str(tmp_path / "a.safetensors"))
    save_file({"w": y}, str(tmp_path / "b.safetensors"))
    (result,) = diff_checkpoints(plan_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors")).results
    assert result.status == "different"
    assert result.metrics["num_diff"] == 2  # identical NaNs are equal bitwise
    assert math.isnan(result.metrics["max_abs_diff"])
    assert result.to_json()["max_abs_diff"] is None


def test_sharded_vs_single_file_hf_is_identical(samples):
    report = diff_checkpoints(plan_diff(samples["hf_llama_sharded"], samples["hf_llama_single"]))
    assert report.identical and report.summary()["compared"] == len(report.results) > 10


def test_filters(pair):
    a, b, *_ = pair
    plan = plan_diff(a, b, include=("p*", "n*"), exclude=("noisy",))
    assert [p.name for p in plan.pairs] == ["perturbed", "new"]


# --- the command line ----------------------------------------------------------------------------


def test_cli_exit_codes(pair, cli, samples):
    a, b, *_ = pair
    assert cli("diff", str(a), str(a)).code == 0
    differ = cli("diff", str(a), str(b))
    assert differ.code == 1
    assert "perturbed" in differ.out and "77,5" in differ.out
    missing = cli("diff", str(a), str(a.parent / "nope"))
    assert missing.code == 2 and missing.err.count("\n") == 1 and "Traceback" not in missing.err
    bad = cli("diff", str(a), str(b), "--atol", "-1")
    assert bad.code == 2


def test_cli_json_schema(pair, cli):
    a, b, base, other = pair
    result = cli("diff", str(a), str(b), "--json")
    assert result.code == 1 and result.err == ""
    data = json.loads(result.out)
    assert {"a", "b", "identical", "summary", "tensors"} <= set(data)
    assert data["identical"] is False
    assert {"compared", "equal", "close", "different", "only_a", "only_b"} <= set(data["summary"])
    for entry in data["tensors"]:
        assert JSON_TENSOR_KEYS <= set(entry)
    by = {t["name"]: t for t in data["tensors"]}
    assert by["gone"]["b"] is None and by["gone"]["max_abs_diff"] is None
    assert by["perturbed"]["num_diff"] == 2
    assert by["perturbed"]["max_abs_diff"] == pytest.approx(_expected(base["perturbed"], other["perturbed"])
                                                            ["max_abs_diff"])


def test_cli_top_bounds_the_report(pair, cli):
    a, b, *_ = pair
    out = cli("diff", str(a), str(b), "--top", "1", "--plain").out
    assert "(1 of 8)" in out  # only_a/only_b are differences too


def test_cli_tolerance_exit_zero(tmp_path, cli):
    g = torch.Generator().manual_seed(1)
    t = torch.randn(10, 10, generator=g)
    save_file({"w": t}, str(tmp_path / "a.safetensors"))
    save_file({"w": t + 1e-6}, str(tmp_path / "b.safetensors"))
    assert cli("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")).code == 1
    assert cli("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--atol", "1e-5").code == 0


def test_diff_never_modifies_inputs(samples, tmp_path):
    src = tmp_path / "copy"
    shutil.copytree(samples["hf_llama_sharded"], src)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    diff_checkpoints(plan_diff(src, samples["hf_llama_single"]))
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_perturbed_sharded_tensor_found(samples, tmp_path):
    src = tmp_path / "perturbed"
    shutil.copytree(samples["hf_llama_sharded"], src)
    shard = sorted(src.glob("model-*.safetensors"))[1]
    tensors = load_file(str(shard))
    name = sorted(tensors)[0]
    flat = tensors[name].view(-1)
    flat[flat.numel() // 2] += 1
    save_file(tensors, str(shard), metadata={"format": "pt"})
    report = diff_checkpoints(plan_diff(samples["hf_llama_sharded"], src))
    differing = [r for r in report.results if r.differs]
    assert [r.name for r in differing] == [name]
    assert differing[0].metrics["num_diff"] == 1


def test_a_renamed_identical_tensor_is_paired_as_renamed(tmp_path, cli):
    """A tensor stored under another name with the same bytes is one 'renamed' pair, not only_a +
    only_b; a same-shaped tensor with other values stays only_a / only_b."""
    torch.manual_seed(0)
    base = {"keep.weight": torch.randn(4, 4), "old.name": torch.randn(3, 5), "gone.weight": torch.randn(3, 5)}
    other = {"keep.weight": base["keep.weight"], "new.name": base["old.name"].clone(),
             "added.weight": torch.randn(3, 5)}
    save_file(base, tmp_path / "a.safetensors")
    save_file(other, tmp_path / "b.safetensors")
    result = cli("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json")
    assert result.code == 1
    doc = json.loads(result.out)
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert by_name["old.name"]["status"] == "renamed" and by_name["old.name"]["renamed_to"] == "new.name"
    assert "new.name" not in by_name
    assert by_name["gone.weight"]["status"] == "only_a" and by_name["added.weight"]["status"] == "only_b"
    assert doc["summary"]["renamed"] == 1 and doc["summary"]["only_a"] == 1 and doc["summary"]["only_b"] == 1
    plain = cli("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--plain")
    assert "renamed -> new.name" in plain.out


# --- the config.json beside the weights ------------------------------------------------------------


def _hf_copy(tmp_path, name: str, **changes):
    from tests.conftest import REPO

    out = tmp_path / name
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_gqa", out)
    config = json.loads((out / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_configs_that_describe_another_model_make_the_diff_differ(tmp_path):
    """Equal tensors under another activation or RoPE base are another model: the diff of two HF dirs
    said identical (exit 0). Each fact is read as transformers reads it (``ops.config_check``)."""
    from tests.conftest import REPO, run_cli

    base = REPO / "sample_ckpts" / "hf_llama_gqa"
    other = _hf_copy(tmp_path, "other", hidden_act="gelu", rope_parameters={"rope_theta": 5e5, "rope_type": "default"})
    result = run_cli("diff", "--json", str(base), str(other))
    assert result.code == 1, result.err
    report = json.loads(result.out)
    facts = {t["name"]: (t["a"], t["b"], t["status"]) for t in report["tensors"] if t["name"].startswith("config.json")}
    assert facts == {"config.json: activation": ('"silu"', '"gelu"', "different"),
                     "config.json: rope_theta": ("10000.0", "500000.0", "different")}
    assert report["identical"] is False
    picked = run_cli("diff", str(base), str(other), "--include", "model.norm.*")  # the user asked about those only
    assert picked.code == 0, picked.out + picked.err


def _mcore_copy(tmp_path, name: str, **changes):
    """``mcore_llama_gqa`` (megatron-core's own save) with its training args edited as a run with other
    flags would have written them (``common.pt``: the pickled ``argparse.Namespace``)."""
    from tests.conftest import REPO

    out = tmp_path / name
    shutil.copytree(REPO / "sample_ckpts" / "mcore_llama_gqa", out)
    common = out / "iter_0000000" / "common.pt"
    state = torch.load(common, weights_only=False)
    for key, value in changes.items():
        setattr(state["args"], key, value)
    torch.save(state, common)
    return out


def _facts(result) -> dict:
    report = json.loads(result.out)
    return {t["name"]: (t["a"], t["b"]) for t in report["tensors"] if t["name"].startswith(("config.json", "Megatron"))}


def test_megatron_saves_whose_args_describe_another_model_make_the_diff_differ(tmp_path):
    """Two Megatron saves of equal tensors whose args say another RoPE base or activation are another
    model: the diff said identical (exit 0), as it did for an HF dir beside a Megatron save with those
    args. The args are compared as convert reads them; the HF side by the rules convert refuses a
    mismatched ``--hf-config`` with."""
    from tests.conftest import REPO, run_cli

    base = REPO / "sample_ckpts" / "mcore_llama_gqa"
    other = _mcore_copy(tmp_path, "other", rotary_base=500000, swiglu=False)
    result = run_cli("diff", "--json", str(base), str(other))
    assert result.code == 1, result.err
    assert _facts(result) == {"Megatron args: rotary_base": ("10000", "500000"),
                              "Megatron args: swiglu": ("true", "false")}
    hf = run_cli("diff", "--json", str(REPO / "sample_ckpts" / "hf_llama_gqa"), str(other))
    assert hf.code == 1, hf.err
    assert _facts(hf) == {"Megatron args: rotary_base": ("10000.0", "500000"),
                          "Megatron args: swiglu": ('"silu"', '"gelu"')}
    assert run_cli("diff", str(base), str(other), "--include", "decoder.final_layernorm.*").code == 0


def test_the_same_model_in_another_megatron_layout_has_no_args_differences(tmp_path):
    """megatron-core's own save against ckptscope's TP=2 per-rank conversion of the same HF model (other
    TP size, padded vocabulary and format in the args): identical, exit 0, no fact listed; so is the HF
    dir against either."""
    from tests.conftest import REPO, run_cli

    hf, mcore = REPO / "sample_ckpts" / "hf_llama_gqa", REPO / "sample_ckpts" / "mcore_llama_gqa"
    tp2 = tmp_path / "tp2"
    assert run_cli("convert", str(hf), str(tp2), "--to", "mcore", "--tp", "2", "--ckpt-format", "torch").code == 0
    for a, b in ((mcore, tp2), (hf, mcore), (hf, tp2)):
        result = run_cli("diff", "--json", str(a), str(b))
        assert result.code == 0 and _facts(result) == {}, (a, b, result.out[-2000:], result.err)


def test_args_of_unexpected_types_are_compared_or_noted_never_a_traceback(tmp_path):
    from tests.conftest import REPO, run_cli

    base = REPO / "sample_ckpts" / "mcore_llama_gqa"
    odd = _mcore_copy(tmp_path, "odd", rotary_base="abc", num_query_groups=[2], hf_config_extra={"rope_theta": []})
    result = run_cli("diff", "--json", str(base), str(odd))
    assert result.code == 1 and "Traceback" not in result.err, result.err
    assert _facts(result) == {"Megatron args: rotary_base": ("10000", '"abc"'),
                              "Megatron args: num_query_groups": ("2", "[2]")}


def test_a_config_transformers_rewrote_in_its_own_spelling_is_the_same_model(tmp_path):
    """transformers' own save of the same config (its defaults spelled out, ``rope_theta`` as
    ``rope_parameters``, ``dtype`` for ``torch_dtype``) is not a difference."""
    from transformers import AutoConfig

    from tests.conftest import REPO, run_cli

    base = REPO / "sample_ckpts" / "hf_llama_gqa"
    rewritten = _hf_copy(tmp_path, "rewritten")
    AutoConfig.from_pretrained(base).save_pretrained(rewritten)
    assert json.loads((rewritten / "config.json").read_text()) != json.loads((base / "config.json").read_text())
    result = run_cli("diff", str(base), str(rewritten))
    assert result.code == 0, result.out + result.err

