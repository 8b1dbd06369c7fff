"""``ckptscope timeline``: per-layer Adam statistics where the optimizer state has no names of its own
(HF Trainer's positional ``optimizer.pt``, Megatron's distributed optimizer), and DeepSpeed
``global_stepN`` roots.

Fixtures are written by the real frameworks (transformers' ``Trainer``, megatron-core on gloo,
DeepSpeed); every number is checked against torch on the state as the framework itself loads it:
the Trainer's own ``create_optimizer`` + ``Optimizer.load_state_dict`` name the positions, DeepSpeed's
own merges give its weights and moments.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO, run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ckptscope.ops.roots import discover_iterations  # noqa: E402
from ckptscope.ops.timeline import build_timeline_plan, module_of, run_timeline  # noqa: E402

REL = 1e-9
SAMPLES = REPO / "sample_ckpts"


def _import(name: str):
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def gen():
    return _import("make_timeline_samples")


@pytest.fixture(scope="module")
def hf_root(tmp_path_factory, gen) -> Path:
    return gen.write_timeline_hf_adam(tmp_path_factory.mktemp("timeline_adam"))


def _result(root, **kwargs):
    plan = build_timeline_plan(root, **kwargs)
    try:
        return plan, run_timeline(plan)
    finally:
        plan.close()


def _checkpoints(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.name.startswith("checkpoint-")), key=lambda p: int(p.name[11:]))


def _trainer_named_moments(checkpoint: Path) -> tuple[dict, list[dict]]:
    """``exp_avg_sq`` per parameter name as transformers itself places them: the model rebuilt from
    the checkpoint, ``Trainer.create_optimizer`` builds its groups, torch's ``load_state_dict`` puts
    every saved position into the parameter at that position."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    args = TrainingArguments(output_dir=str(checkpoint / "unused"), use_cpu=True, report_to="none",
                             weight_decay=0.01)
    optimizer = Trainer(model=model, args=args).create_optimizer()
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    optimizer.load_state_dict(saved)
    names = {id(p): n for n, p in model.named_parameters()}
    moments = {names[id(p)]: s["exp_avg_sq"].double() for p, s in optimizer.state.items()}
    return moments, saved["param_groups"]


def test_hf_trainer_adam_statistics_equal_torch(hf_root, gen):
    plan, result = _result(hf_root)
    assert result.optimizer_note is None
    checkpoints = _checkpoints(hf_root)
    assert result.iterations == list(range(1, gen.ADAM_STEPS + 1)) == [int(p.name[11:]) for p in checkpoints]
    expected_lr = [torch.load(p / "scheduler.pt", weights_only=True)["_last_lr"][0] for p in checkpoints]
    assert result.lr == expected_lr
    named = [_trainer_named_moments(p) for p in checkpoints]
    assert plan.eps == named[0][1][0]["eps"] == 1e-8
    assert sorted(m.name for m in result.moments) == sorted(named[0][0]) == sorted(t.name for t in plan.tensors)
    for m in result.moments:
        for k, (moments, _groups) in enumerate(named):
            mean = float(moments[m.name].mean())
            assert m.exp_avg_sq_mean[k] == pytest.approx(mean, rel=REL), (m.name, k)
            assert m.step_size_mean[k] == pytest.approx(expected_lr[k] / (math.sqrt(mean) + 1e-8), rel=REL)
    mlp = next(m for m in result.moment_modules if m.name == "model.layers.1.mlp")
    for k, (moments, _groups) in enumerate(named):
        v = torch.cat([moments[f"model.layers.1.mlp.{p}_proj.weight"].flatten() for p in ("gate", "up", "down")])
        assert mlp.exp_avg_sq_mean[k] == pytest.approx(float(v.mean()), rel=REL)
    assert any("named by position (Trainer.create_optimizer" in n for n in result.notes)
    data = json.loads(run_cli("timeline", str(hf_root), "--json").out)
    assert data["optimizer"]["note"] is None and len(data["optimizer"]["tensors"]) == len(result.moments)


def _rewrite_config(checkpoint: Path, **changes) -> None:
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_another_models_config_gives_no_statistics_and_says_why(hf_root, tmp_path):
    """A config whose MLP is narrower has the same number of parameters in the same groups: only the
    shape check can tell, and then no statistics are attributed at all."""
    root = tmp_path / "run"
    shutil.copytree(hf_root, root)
    for checkpoint in _checkpoints(root):
        _rewrite_config(checkpoint, intermediate_size=48)
    _plan, result = _result(root)
    assert result.moments == [] and result.moment_modules == []
    note = result.optimizer_note
    assert "cannot tell which parameter each position of optimizer.pt is" in note
    assert "exp_avg_sq is [64, 32], its parameter model.layers.0.mlp.gate_proj.weight is [48, 32]" in note


def test_one_mismatched_iteration_has_no_statistics(hf_root, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(hf_root, root)
    _rewrite_config(root / "checkpoint-2", num_hidden_layers=3)
    _plan, result = _result(root)
    assert result.optimizer_note is None and result.moments
    for m in result.moments:
        assert m.exp_avg_sq_mean[1] is None and m.step_size_mean[1] is None
        assert m.exp_avg_sq_mean[0] is not None and m.exp_avg_sq_mean[2] is not None
    why = next(n for n in result.notes if n.startswith("no Adam statistics for iteration 2:"))
    assert "LlamaForCausalLM has 30 parameters" in why and "expected [23, 7]" in why, why



# --- DeepSpeed global_stepN roots -----------------------------------------------------------------


def _oracle_numbers(states: list[dict], moments: list[dict], result) -> None:
    """Per tensor: norms and relative changes from DeepSpeed's own fp32 merge, mean exp_avg_sq from its
    moment merge, each computed with torch."""
    by_name = {s.name: s for s in result.tensors}
    common = set(states[0]).intersection(*states[1:])
    assert common and common <= set(by_name)
    for name in common:
        series = by_name[name]
        for k, state in enumerate(states):
            assert series.norm[k] == pytest.approx(float(state[name].double().norm()), rel=REL), name
        prev, cur = states[0][name].double(), states[1][name].double()
        assert series.change[0] == pytest.approx(float((cur - prev).norm() / prev.norm()), rel=REL), name
    by_moment = {m.name: m for m in result.moments}
    assert set(moments[0]) <= set(by_moment) and moments[0]
    for name in moments[0]:
        for k, state in enumerate(moments):
            mean = float(state[name].double().mean())
            assert by_moment[name].exp_avg_sq_mean[k] == pytest.approx(mean, rel=REL), name
            assert by_moment[name].step_size_mean[k] == pytest.approx(result.lr[k] / (math.sqrt(mean) + 1e-8),
                                                                       rel=REL)


def test_deepspeed_root_from_the_shipped_saves(tmp_path):
    """The shipped ZeRO-1 and ZeRO-2 saves (DeepSpeed 0.19.8, the same model, two steps each) as the two
    tags of one save dir: discovered as iterations 1 and 2, ``latest`` names the newest."""
    shipped = SAMPLES / "deepspeed_zero"
    root = tmp_path / "ds"
    root.mkdir()
    for step, stage in ((1, 1), (2, 2)):
        (root / f"global_step{step}").symlink_to(shipped / f"zero{stage}" / "global_step2")
    (root / "latest").write_text("global_step2")
    found = discover_iterations(root)
    assert [(i.iteration, i.kind, i.complete, i.latest) for i in found] == [(2, "deepspeed", True, True),
                                                                            (1, "deepspeed", True, False)]
    _plan, result = _result(root)
    assert result.kind == "deepspeed" and result.iterations == [1, 2] and result.optimizer_note is None
    assert result.lr == [1e-2, 1e-2]
    states = [torch.load(shipped / f"zero{s}.fp32_oracle.pt", weights_only=True) for s in (1, 2)]
    moments = [{k[len("exp_avg_sq."):]: v for k, v in torch.load(shipped / f"zero{s}.moments_oracle.pt",
                                                                  weights_only=True).items()
                if k.startswith("exp_avg_sq.")} for s in (1, 2)]
    _oracle_numbers(states, moments, result)
    listing = run_cli("inspect", str(root))
    assert listing.code == 0 and "global_step2" in listing.out + listing.err


def test_hf_trainer_checkpoint_with_deepspeed_inside_stays_a_checkpoint(hf_root, tmp_path):
    """``Trainer`` under DeepSpeed writes ``checkpoint-N/global_stepN/`` + ``latest`` beside the model:
    that dir is one checkpoint, not a save root of DeepSpeed iterations."""
    from ckptscope.ops.roots import resolve_root

    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(hf_root / "checkpoint-1", checkpoint)
    (checkpoint / "global_step1").symlink_to(SAMPLES / "deepspeed_zero" / "zero1" / "global_step2")
    (checkpoint / "latest").write_text("global_step1")
    assert discover_iterations(checkpoint) is None and resolve_root(checkpoint) == str(checkpoint)


def test_deepspeed_two_step_run(tmp_path):
    """A real ZeRO-2 run (2 gloo ranks) saving every step under DeepSpeed's default tags."""
    pytest.importorskip("deepspeed")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root = _import("make_deepspeed_samples").write_deepspeed_steps(tmp_path)
    assert (root / "latest").read_text().strip() == "global_step2"
    _plan, result = _result(root)
    assert result.kind == "deepspeed" and result.iterations == [1, 2] and result.optimizer_note is None
    merged = [get_fp32_state_dict_from_zero_checkpoint(str(root), tag=f"global_step{k}") for k in (1, 2)]
    states = [{n: v.detach() for n, v in state.items()} for state in merged]
    by_name = {s.name: s for s in result.tensors}
    for name in states[0]:
        prev, cur = states[0][name].double(), states[1][name].double()
        assert by_name[name].norm[1] == pytest.approx(float(cur.norm()), rel=REL), name
        if prev.norm() > 0:
            assert by_name[name].change[0] == pytest.approx(float((cur - prev).norm() / prev.norm()), rel=REL)
    assert {m.name for m in result.moments} == {n for n in states[0] if n != "model.layers.0.input_layernorm.weight"}


# --- Megatron's distributed optimizer --------------------------------------------------------------


@pytest.fixture(scope="module")
def distopt(tmp_path_factory, gen) -> dict[str, Path]:
    pytest.importorskip("megatron.core")
    return gen.write_timeline_distopt(tmp_path_factory.mktemp("timeline_distopt"))


def _flat_moments(distopt: dict[str, Path], gen, flavour: str) -> list[dict]:
    """``exp_avg_sq`` per parameter (megatron's own parameter names), cut out of the flat buffers at the
    places megatron-core's ``param_index_map`` recorded while training; the buffers loaded by torch's
    own ``dcp.load`` (torch_dist buckets) or ``torch.load`` (``distrib_optim.pt``: buckets concatenated
    at their unpadded ends)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    (layout,) = json.loads((distopt[flavour].parent / gen.DISTOPT_LAYOUT).read_text())
    buckets = layout["buckets"]
    out = []
    for step in sorted(p for p in distopt[flavour].iterdir() if p.name.startswith("iter_")):
        if flavour == "legacy":
            flat = torch.load(step / "mp_rank_00" / "distrib_optim.pt", weights_only=False)[0]
            (vector,) = [v["exp_avg_sq"] for v in flat.values()]
            bases = [sum(n for _o, n in buckets[:b]) for b in range(len(buckets))]
            parts = {b: vector[bases[b]: bases[b] + n] for b, (_o, n) in enumerate(buckets)}
        else:
            meta = FileSystemReader(str(step)).read_metadata().state_dict_metadata
            state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in meta.items()
                     if k.startswith("optimizer.distributed.") and k.endswith(".exp_avg_sq")}
            dcp.load(state, checkpoint_id=str(step))
            parts = {int(k.split(".bucket_idx_")[1].split(".")[0]): v for k, v in state.items()}
        out.append({name: parts[b][start - buckets[b][0]: end - buckets[b][0]].double()
                    for name, (start, end, b) in layout["params"].items()})
    return out, layout


def _flat_statistics_equal(root: Path, expected: list[dict], gen):
    """The timeline of a distributed-optimizer root gives, for every tensor and step, the mean
    ``exp_avg_sq`` of ``expected`` (per step: megatron's parameter name -> its global state) and the
    step size at that mean; returns the result."""
    plan, result = _result(root)
    assert result.kind == "megatron" and result.iterations == list(range(1, gen.DISTOPT_STEPS + 1))
    assert result.optimizer_note is None and result.lr == [gen.LR] * gen.DISTOPT_STEPS and plan.eps == 1e-8
    by_name = {_legacy_name(m.name): m for m in result.moments}
    assert sorted(by_name) == sorted(expected[0])
    for name, m in by_name.items():
        for k, state in enumerate(expected):
            mean = float(state[name].mean())
            assert m.exp_avg_sq_mean[k] == pytest.approx(mean, rel=REL), (root.name, name, k)
            assert m.step_size_mean[k] == pytest.approx(gen.LR / (math.sqrt(mean) + 1e-8), rel=REL)
    return result


def _legacy_name(name: str) -> str:
    """torch_dist (TE-style) norm names -> the local spec's parameter (and legacy ``state_dict``) names."""
    return (name.replace("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight")
            .replace("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"))


@pytest.mark.parametrize("flavour", ["dp_reshardable", "legacy"])
def test_megatron_distributed_optimizer_adam_statistics(distopt, gen, flavour):
    expected, layout = _flat_moments(distopt, gen, flavour)
    assert len(layout["buckets"]) > 1  # later buckets start after the earlier ones' end padding
    result = _flat_statistics_equal(distopt[flavour], expected, gen)
    mlp = next(m for m in result.moment_modules if m.name == "decoder.layers.1.mlp")
    members = [_legacy_name(m.name) for m in result.moments if module_of(m.name)[0] == "decoder.layers.1.mlp"]
    assert len(members) == (2 if flavour == "legacy" else 3)  # legacy names the MLP's norm pre_mlp_layernorm
    for k, state in enumerate(expected):
        v = torch.cat([state[n] for n in members])
        assert mlp.exp_avg_sq_mean[k] == pytest.approx(float(v.mean()), rel=REL)


def test_megatron_fully_reshardable_state_of_later_buckets_is_refused(distopt, gen):
    """megatron-core 0.16.1's own ``fully_reshardable`` save, with several grad buckets, stores each
    later bucket's state shifted by the bucket padding under the right names (it warns "param range
    exceeds unpadded buffer"). Its fp32 masters then differ from the weights: those tensors get no
    statistics and a note; the first bucket's are right and kept."""
    expected, layout = _flat_moments(distopt, gen, "dp_reshardable")
    first = {n for n, (_s, _e, b) in layout["params"].items() if b == 0}
    assert 0 < len(first) < len(layout["params"])
    _plan, result = _result(distopt["fully_reshardable"])
    assert result.optimizer_note is None
    assert {_legacy_name(m.name) for m in result.moments} == first
    for m in result.moments:
        for k, state in enumerate(expected):
            assert m.exp_avg_sq_mean[k] == pytest.approx(float(state[_legacy_name(m.name)].mean()), rel=REL)
    refused = [n for n in result.notes if "whose saved fp32 master is not its weights" in n]
    assert len(refused) == gen.DISTOPT_STEPS
    assert all(f"{len(layout['params']) - len(first)} tensors" in n for n in refused)
def test_megatron_optimizer_file_of_another_save_gives_no_statistics(distopt, tmp_path):
    """``distrib_optim.pt`` of iteration 1 put into iteration 2: its fp32 masters are not iteration 2's
    weights, so nothing is named there (and iteration 1 keeps its numbers)."""
    root = tmp_path / "run"
    shutil.copytree(distopt["legacy"], root)
    shutil.copy(root / "iter_0000001/mp_rank_00/distrib_optim.pt", root / "iter_0000002/mp_rank_00/distrib_optim.pt")
    _plan, result = _result(root)
    assert result.moments and all(m.exp_avg_sq_mean[1] is None and m.exp_avg_sq_mean[0] is not None
                                  for m in result.moments)
    why = next(n for n in result.notes if n.startswith("no Adam statistics for iteration 2:"))
    assert "no model tensor's weights equal the fp32 masters at element 0" in why


def test_megatron_flat_state_sampled_rows(distopt, gen):
    """``--sample``: a parameter's sampled rows are the same elements of its flat buffer range."""
    expected, _layout = _flat_moments(distopt, gen, "dp_reshardable")
    plan, result = _result(distopt["dp_reshardable"], sample=3)
    tensor = next(t for t in plan.tensors if t.name == "output_layer.weight")
    moment = next(m for m in result.moments if m.name == "output_layer.weight")
    assert tensor.rows is not None and sum(hi - lo for lo, hi in tensor.rows) == 3
    for k, state in enumerate(expected):
        full = state["output_layer.weight"].reshape(tensor.shape)
        rows = torch.cat([full[lo:hi] for lo, hi in tensor.rows])
        assert moment.exp_avg_sq_mean[k] == pytest.approx(float(rows.mean()), rel=REL)


# --- Megatron's distributed optimizer saved by several model-parallel ranks (TP = 2, PP = 2) ------------


@pytest.fixture(scope="module")
def distopt_mp(tmp_path_factory, gen) -> dict[str, dict[str, Path]]:
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("timeline_distopt_mp")
    return {label: gen.write_timeline_distopt_mp(out, label) for label in gen.DISTOPT_MP}


_TP_SPLIT = {"self_attention.linear_qkv.weight": 0, "mlp.linear_fc1.weight": "glu",
             "self_attention.linear_proj.weight": 1, "mlp.linear_fc2.weight": 1,
             "embedding.word_embeddings.weight": 0, "output_layer.weight": 0}
"""How megatron-core splits each parameter over TP ranks (column-parallel and vocab-parallel on the
first axis, SwiGLU fc1 as ``[gate_r; up_r]`` of the global ``[gate; up]``, row-parallel on the second,
norms replicated). Not trusted as such: ``_mp_oracle`` checks it against the weights megatron-core
saved (torch's own ``dcp.load``)."""


def _tp_global(parts: list, name: str):
    split = next((axis for suffix, axis in _TP_SPLIT.items() if name.endswith(suffix)), None)
    if split is None or len(parts) == 1:
        assert all(torch.equal(parts[0], p) for p in parts[1:]), name  # replicas hold the same state
        return parts[0]
    if split == "glu":
        halves = [p.chunk(2) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(parts, dim=split)


def _saved_weights(step: Path, name: str, saved: dict):
    """A parameter (local-spec name) of a torch_dist save loaded by torch's ``dcp.load`` (``saved``:
    its layer-stacked tensors, one row per layer)."""
    parts = name.split(".")
    key = name if parts[1] != "layers" else ".".join(parts[:2] + parts[3:])
    key = key.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight") \
        .replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")
    return saved[key][int(parts[2])] if parts[1] == "layers" else saved[key]


def _mp_oracle(roots: dict[str, Path], gen, label: str) -> list[dict]:
    """Per step: every parameter's global ``exp_avg_sq`` (float64, megatron's local-spec names), put
    together from megatron-core's own per-rank optimizer state (the ranks that hold it). The same
    assembly of its own fp32 masters must give the global weights of the torch_dist save bit for bit,
    loaded by torch's ``dcp.load``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    tp, pp = gen.DISTOPT_MP[label]
    base = roots["dp_reshardable"].parent
    ranks = [torch.load(base / gen.distopt_mp_oracle(label, r), weights_only=True) for r in range(tp * pp)]
    out = []
    for k, step in enumerate(sorted(p for p in roots["dp_reshardable"].iterdir() if p.name.startswith("iter_"))):
        meta = FileSystemReader(str(step)).read_metadata().state_dict_metadata
        saved = {key: torch.empty(tuple(v.size), dtype=v.properties.dtype) for key, v in meta.items()
                 if not key.startswith("optimizer.") and hasattr(v, "size")}
        dcp.load(saved, checkpoint_id=str(step))
        moments = {}
        for name in sorted(set().union(*(r[k] for r in ranks))):
            held = [r[k][name] for r in ranks if name in r[k]]
            assert len(held) == tp, name  # each parameter on one pipeline stage, on every TP rank of it
            assert torch.equal(_tp_global([h["param"] for h in held], name), _saved_weights(step, name, saved))
            moments[name] = _tp_global([h["exp_avg_sq"] for h in held], name).double()
        out.append(moments)
    return out


@pytest.mark.parametrize("label", ["tp2", "pp2"])
@pytest.mark.parametrize("flavour", ["dp_reshardable", "legacy"])
def test_megatron_model_parallel_distributed_optimizer_adam_statistics(distopt_mp, gen, label, flavour):
    """TP = 2 (each rank's flat buffers hold its shards) and PP = 2 (each holds its stage's layers): the
    statistics are those of the global parameters put together from megatron-core's own per-rank
    state (replicated norms: one replica)."""
    expected = _mp_oracle(distopt_mp[label], gen, label)
    result = _flat_statistics_equal(distopt_mp[label][flavour], expected, gen)
    assert not any(n.startswith("no Adam statistics") for n in result.notes), result.notes
    attention = next(m for m in result.moment_modules if m.name == "decoder.layers.1.self_attention")
    members = [_legacy_name(m.name) for m in result.moments
               if module_of(m.name)[0] == "decoder.layers.1.self_attention"]
    assert len(members) == (2 if flavour == "legacy" else 3)
    for k, state in enumerate(expected):
        v = torch.cat([state[n].flatten() for n in members])  # the replicated norm counted once
        assert attention.exp_avg_sq_mean[k] == pytest.approx(float(v.mean()), rel=REL)


def test_megatron_tp2_flat_state_sampled_rows(distopt_mp, gen):
    """``--sample``: the sampled rows of a parameter split over TP ranks are read from each rank's shard
    at the right place (first-axis, second-axis and SwiGLU splits)."""
    expected = _mp_oracle(distopt_mp["tp2"], gen, "tp2")
    plan, result = _result(distopt_mp["tp2"]["dp_reshardable"], sample=5)
    moments = {m.name: m for m in result.moments}
    for name in ("decoder.layers.1.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc2.weight",
                 "decoder.layers.0.self_attention.linear_proj.weight", "embedding.word_embeddings.weight"):
        tensor = next(t for t in plan.tensors if t.name == name)
        assert tensor.rows is not None and sum(hi - lo for lo, hi in tensor.rows) == 5
        for k, state in enumerate(expected):
            rows = torch.cat([state[name][lo:hi] for lo, hi in tensor.rows])
            assert moments[name].exp_avg_sq_mean[k] == pytest.approx(float(rows.mean()), rel=REL), (name, k)


def test_megatron_tp2_tampered_master_gives_no_statistics(distopt_mp, gen, tmp_path):
    """One element of TP rank 1's fp32 masters changed in iteration 2's ``distrib_optim.pt`` (written
    back by ``torch.save``): that rank's buffer no longer equals the weights there, so it names nothing, with
    the reason, never a wrong assignment. The tensors split over both ranks get no statistics at iteration 2
    (their part 1 is in that buffer); the replicated norms, whole in rank 0's buffer, keep theirs (a buffer
    that could not be named used to take every other buffer's statistics with it); iteration 1 is whole."""
    root = tmp_path / "run"
    shutil.copytree(distopt_mp["tp2"]["legacy"], root)
    path = root / "iter_0000002" / "mp_rank_01" / "distrib_optim.pt"
    state = torch.load(path, weights_only=False)
    (flat,) = state[0].values()
    flat["param"][1000] += 1.0
    torch.save(state, path)
    expected = _mp_oracle(distopt_mp["tp2"], gen, "tp2")
    _plan, result = _result(root)
    assert result.optimizer_note is None and result.moments
    split = {_legacy_name(n) for n in expected[1] if any(n.endswith(s) for s in _TP_SPLIT)}
    for m in result.moments:
        assert m.exp_avg_sq_mean[0] == pytest.approx(float(expected[0][m.name].mean()), rel=REL)
        if m.name in split:
            assert m.exp_avg_sq_mean[1] is None, m.name
        else:
            assert m.exp_avg_sq_mean[1] == pytest.approx(float(expected[1][m.name].mean()), rel=REL)
    why = next(n for n in result.notes if n.startswith("no Adam statistics for iteration 2: for the tensors of one"))
    assert "no model tensor's weights equal the fp32 masters at element" in why and "mp_rank_01" in why, why


def test_megatron_tp2_rank_file_of_another_rank_leaves_split_tensors_out(distopt_mp, gen, tmp_path):
    """TP rank 1's ``distrib_optim.pt`` replaced by rank 0's in iteration 2: every position still equals
    weights (rank 0's shards), but the split tensors then have part 0 twice and no part 1: they get no
    statistics there, with the reason; the replicated norms are whole in both and keep theirs."""
    root = tmp_path / "run"
    shutil.copytree(distopt_mp["tp2"]["legacy"], root)
    step = root / "iter_0000002"
    shutil.copy(step / "mp_rank_00" / "distrib_optim.pt", step / "mp_rank_01" / "distrib_optim.pt")
    expected = _mp_oracle(distopt_mp["tp2"], gen, "tp2")
    _plan, result = _result(root)
    split = {m.name for m in result.moments if m.exp_avg_sq_mean[1] is None}
    assert split == {_legacy_name(n) for n in expected[1] if any(n.endswith(s) for s in _TP_SPLIT)}
    for m in result.moments:
        assert m.exp_avg_sq_mean[0] == pytest.approx(float(expected[0][m.name].mean()), rel=REL)
        if m.name not in split:
            assert m.exp_avg_sq_mean[1] == pytest.approx(float(expected[1][m.name].mean()), rel=REL)
    (why,) = [n for n in result.notes if n.startswith("no Adam statistics for iteration 2:")]
    assert f"iteration 2: for {len(split)} tensors whose model-parallel shards do not make them up: " in why
    assert "decoder.layers.0.mlp.linear_fc2.weight: found as second-axis parts of 2, not each part once " \
           "(part 0 2 times)" in why, why


@pytest.fixture(scope="module")
def distopt_variants(tmp_path_factory, gen) -> dict[str, dict[str, Path]]:
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("timeline_distopt_variants")
    return {label: gen.write_timeline_distopt_mp(out, label) for label in gen.DISTOPT_VARIANTS}


def _variant_oracle(roots: dict[str, Path], gen, label: str) -> list[dict]:
    """Per step: every parameter's ``exp_avg_sq`` (float64, local-spec names) from megatron-core's own
    per-rank state (TP = 1: each rank holds its parameters whole)."""
    tp, pp, _options = gen.DISTOPT_VARIANTS[label]
    base = roots["dp_reshardable"].parent
    ranks = [torch.load(base / gen.distopt_mp_oracle(label, r), weights_only=True) for r in range(tp * pp)]
    return [{name: state["exp_avg_sq"].double() for r in ranks for name, state in r[k].items()}
            for k in range(gen.DISTOPT_STEPS)]


def _moments_by_name(root: Path) -> tuple[dict, list[str]]:
    _plan, result = _result(root)
    assert result.optimizer_note is None, result.optimizer_note
    return {_legacy_name(m.name): m for m in result.moments}, result.notes


@pytest.mark.parametrize("flavour", ["dp_reshardable", "legacy"])
def test_megatron_norms_all_one_at_warmup_leave_only_themselves_out(distopt_variants, gen, flavour):
    """Every norm 1.0 at iteration 1 (a warmup step too small to move them), 16-wide q/k norms beside 64-wide
    layer norms: a norm's masters fit every norm's place, of either length. Only the norms go without
    statistics there, named in the notes; every other tensor of that iteration keeps exactly megatron-core's
    numbers (the whole iteration had none: "... both equal the fp32 masters ... with different lengths")."""
    expected = _variant_oracle(distopt_variants["qkn_warm"], gen, "qkn_warm")
    moments, notes = _moments_by_name(distopt_variants["qkn_warm"][flavour])
    assert sorted(moments) == sorted(expected[0])
    norms = {n for n in moments if "layernorm" in n}
    assert any("q_layernorm" in n for n in norms) and any("input_layernorm" in n for n in norms)
    for name, m in moments.items():
        for k, state in enumerate(expected):
            if k == 0 and name in norms:
                assert m.exp_avg_sq_mean[k] is None, name
            else:
                assert m.exp_avg_sq_mean[k] == pytest.approx(float(state[name].mean()), rel=REL), (name, k)
    (apart,) = [n for n in notes if "not told apart" in n]
    listed = apart.split(": ", 1)[1].split(", ")
    assert listed and all("layernorm" in n or "layer_norm" in n for n in listed), apart
    assert not any(n.startswith("no Adam statistics for iteration") for n in notes), notes


@pytest.mark.parametrize("flavour", ["dp_reshardable", "legacy"])
def test_megatron_pp2_tied_embeddings_get_their_statistics(distopt_variants, gen, flavour):
    """Tied embeddings over two pipeline stages: the last stage's output layer equals the first's embedding.
    Per-rank files (--ckpt-format torch) hold both, and each stage's buffer was matched against every rank's
    tensors, so the two fitted each other's place and neither got statistics; a stage's buffer whose last
    parameter is a norm (32 wide, padded to 64) failed at its end padding in torch_dist. Every tensor now has
    megatron-core's numbers at every iteration."""
    expected = _variant_oracle(distopt_variants["pp2_tied"], gen, "pp2_tied")
    moments, notes = _moments_by_name(distopt_variants["pp2_tied"][flavour])
    assert "embedding.word_embeddings.weight" in moments
    assert ("output_layer.weight" in moments) == (flavour == "legacy")  # torch_dist saves the tied pair once
    for name, m in moments.items():
        for k, state in enumerate(expected):
            assert m.exp_avg_sq_mean[k] == pytest.approx(float(state[name].mean()), rel=REL), (name, k)
    assert not any("not told apart" in n or n.startswith("no Adam statistics") for n in notes), notes
