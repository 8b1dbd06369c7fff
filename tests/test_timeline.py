"""``ckptscope timeline``: save roots of a tiny model really trained a few steps (torch DCP in a
torchtitan-style folder, and transformers' Trainer), with a frozen layer, a NaN, an LR spike and a bad
resume planted at known steps (sample_ckpts/make_timeline_samples.py).

Every flag must appear exactly where it was planted and nowhere else, and every number must equal a
direct torch computation on the tensors as torch's own loaders read them (``dcp.load``,
``safetensors.torch.load_file``, ``torch.load``), never through ckptscope's readers.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.conftest import REPO, run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ckptscope.core.errors import CkptError  # noqa: E402
from ckptscope.ops.timeline import TimelineOptions, build_timeline_plan, module_of, run_timeline  # noqa: E402

REL = 1e-9


@pytest.fixture(scope="session")
def gen():
    """The generator as an importable module: mp.spawn pickles the Megatron rank function by name."""
    samples = str(REPO / "sample_ckpts")
    if samples not in sys.path:
        sys.path.insert(0, samples)
    return importlib.import_module("make_timeline_samples")


@pytest.fixture(scope="session")
def roots(tmp_path_factory, gen) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("timeline")
    return {name: gen.WRITERS[name](out) for name in ("timeline_dcp", "timeline_hf", "timeline_fsdp2", "timeline_verl")}


@pytest.fixture(scope="session")
def megatron_root(tmp_path_factory, gen) -> Path:
    pytest.importorskip("megatron.core")
    return gen.write_timeline_megatron(tmp_path_factory.mktemp("timeline_megatron"))


def _result(root, **kwargs):
    options = kwargs.pop("options", None)
    plan = build_timeline_plan(root, **kwargs)
    try:
        return plan, run_timeline(plan, options=options)
    finally:
        plan.close()


@pytest.fixture(scope="session")
def dcp_run(roots):
    return _result(roots["timeline_dcp"])


@pytest.fixture(scope="session")
def hf_run(roots):
    return _result(roots["timeline_hf"])


@pytest.fixture(scope="session")
def fsdp2_run(roots):
    return _result(roots["timeline_fsdp2"])


# --- independent loading ------------------------------------------------------------------------


def _dcp_tensors(step_dir: Path) -> dict:
    """Every tensor of a DCP save, loaded by torch's own ``dcp.load`` into templates built from torch's
    own metadata reader."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(step_dir)).read_metadata()
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
             for k, v in meta.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=str(step_dir))
    return state


def _verl_rank_files(actor: Path, kind: str) -> list:
    files = sorted(actor.glob(f"{kind}_world_size_*_rank_*.pt"), key=lambda f: int(f.stem.rsplit("_", 1)[1]))
    return [torch.load(f, weights_only=False) for f in files]  # our own fixture: torch's full unpickler


def _verl_tensors(actor: Path) -> dict:
    """A verl FSDP actor dir's model, by ``torch.load`` of every rank file: the DTensor shards put
    back together along dim 0 in rank order (FSDP2's ``Shard(0)``)."""
    parts = [sd for sd in _verl_rank_files(actor, "model")]
    return {name: torch.cat([sd[name].to_local() for sd in parts]) for name in parts[0]}


def _hf_tensors(step_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(step_dir / "model.safetensors"))


def _steps(root: Path, kind: str) -> list[tuple[int, Path]]:
    if kind == "megatron":
        return sorted((int(p.name[5:]), p) for p in root.iterdir() if p.name.startswith("iter_"))
    if kind == "verl":
        return sorted((int(p.name.rsplit("_", 1)[1]), p / "actor") for p in root.iterdir()
                      if p.name.startswith("global_step_"))
    if kind == "dcp":
        dirs = [(int(p.name.split("-")[1]), p) for p in (root / "checkpoint").iterdir()]
    else:
        dirs = [(int(p.name.split("-")[1]), p) for p in root.iterdir() if p.name.startswith("checkpoint-")]
    return sorted(dirs)


def _expected_series(states: list[dict], names: list[str]) -> dict:
    """Norms, changes, max |dW|, NaN counts of ``names`` taken as one flat vector, with torch."""
    out = {"norm": [], "nan": [], "change": [], "abs_change": [], "max_abs_change": []}
    flat = [torch.cat([s[n].double().flatten() for n in names]) for s in states]
    for x in flat:
        finite = torch.isfinite(x)
        out["norm"].append(float(x[finite].norm()))
        out["nan"].append(int(torch.isnan(x).sum()))
    for prev, cur in zip(flat, flat[1:]):
        both = torch.isfinite(prev) & torch.isfinite(cur)
        d = cur[both] - prev[both]
        out["abs_change"].append(float(d.norm()))
        out["change"].append(float(d.norm() / prev[both].norm()))
        out["max_abs_change"].append(float(d.abs().max()))
    return out


def _assert_series(series, expected: dict) -> None:
    for key, values in expected.items():
        got = getattr(series, key)
        assert len(got) == len(values), key
        for g, e in zip(got, values):
            assert g == pytest.approx(e, rel=REL, abs=1e-300), (series.name, key, got, values)


# --- flags where planted, nowhere else ----------------------------------------------------------


def _flag_set(result) -> set[tuple]:
    return {(f.kind, f.iteration, f.subject) for f in result.flags}


def _planted(gen, names: list[str], *, resume: bool) -> set[tuple]:
    frozen = [n for n in names if n.startswith(gen.FROZEN_PREFIX)]
    moving = [n for n in names if not n.startswith(gen.FROZEN_PREFIX)]
    first = 1
    flags = {("frozen", first + 1, n) for n in frozen}
    flags.add(("nan", gen.NAN_STEP, gen.NAN_TENSOR))
    flags |= {("exploding", gen.SPIKE_STEP, n) for n in moving}
    if resume:
        flags.add(("stale", gen.RESUME_STEP, "model"))
    return flags


def test_dcp_flags_exactly_where_planted(gen, dcp_run):
    plan, result = dcp_run
    assert result.iterations == [*range(1, gen.STEPS + 1), gen.RESUME_STEP]
    names = [t.name for t in plan.tensors]
    assert len(names) == 21
    assert _flag_set(result) == _planted(gen, names, resume=True)
    frozen = [f for f in result.flags if f.kind == "frozen"]
    assert {(f.since, f.until) for f in frozen} == {(1, gen.RESUME_STEP)}
    stale = next(f for f in result.flags if f.kind == "stale")
    assert stale.since == gen.RESUME_FROM and "older save" in stale.reason


def test_hf_trainer_flags_exactly_where_planted(gen, hf_run):
    plan, result = hf_run
    assert result.kind == "hf-trainer" and result.iterations == list(range(1, gen.STEPS + 1))
    assert _flag_set(result) == _planted(gen, [t.name for t in plan.tensors], resume=False)
    assert {(f.since, f.until) for f in result.flags if f.kind == "frozen"} == {(1, gen.STEPS)}


def test_fsdp2_flags_exactly_where_planted(gen, roots, fsdp2_run):
    """torchtitan's layout for real: FSDP2 on two ranks, so every tensor of every save is two row
    chunks in two ``.distcp`` files (checked with torch's own metadata reader)."""
    from torch.distributed.checkpoint import FileSystemReader

    plan, result = fsdp2_run
    assert result.kind == "torchtitan" and result.iterations == list(range(1, gen.STEPS + 1))
    step = _steps(roots["timeline_fsdp2"], "dcp")[0][1]
    chunks = FileSystemReader(str(step)).read_metadata().state_dict_metadata[gen.NAN_TENSOR].chunks
    assert sorted(tuple(c.offsets) for c in chunks) == [(0, 0), (gen.VOCAB // 2, 0)]
    assert _flag_set(result) == _planted(gen, [t.name for t in plan.tensors], resume=False)


def test_verl_flags_numbers_and_adam_statistics(gen, roots):
    """verl's FSDP layout (``torch.save`` of DTensor shards per rank, positional optimizer state), the
    FSDP2 run saved as verl's checkpoint manager saves: flags where planted, and every number equal
    to torch's on the rank files loaded by ``torch.load``; the Adam state's positions are the model
    state dict's order (verl's one param group of every parameter)."""
    plan, result = _result(roots["timeline_verl"])
    assert result.kind == "verl" and result.iterations == list(range(1, gen.STEPS + 1))
    names = [t.name for t in plan.tensors]
    assert _flag_set(result) == _planted(gen, names, resume=False)
    actors = [path for _step, path in _steps(roots["timeline_verl"], "verl")]
    states = [_verl_tensors(actor) for actor in actors]
    for series in result.tensors:
        _assert_series(series, _expected_series(states, [series.name]))
    for module in result.modules:
        _assert_series(module, _expected_series(states, [n for n in names if module_of(n)[0] == module.name]))

    assert any("named by position (verl" in note for note in result.notes)
    trained = [n for n in names if not n.startswith(gen.FROZEN_PREFIX)]
    assert sorted(m.name for m in result.moments) == sorted(trained)
    expected_lr = [gen.LR * (gen.SPIKE_FACTOR if s == gen.SPIKE_STEP - 1 else 1.0) for s in result.iterations]
    assert result.lr == pytest.approx(expected_lr, rel=1e-12)
    for k, actor in enumerate(actors):
        order = list(_verl_rank_files(actor, "model")[0])
        optim = _verl_rank_files(actor, "optim")
        for m in result.moments:
            pos = order.index(m.name)
            v = torch.cat([o["state"][pos]["exp_avg_sq"].to_local() for o in optim]).double()
            assert m.exp_avg_sq_mean[k] == pytest.approx(float(v.mean()), rel=REL)
            assert m.step_size_mean[k] == pytest.approx(result.lr[k] / (math.sqrt(float(v.mean())) + 1e-8), rel=REL)


def test_verl_optimizer_that_is_not_one_group_in_model_order_gives_no_statistics(gen, roots, tmp_path):
    """Positions are named only under verl's own construction: the same state split into two param
    groups (as a decay / no-decay optimizer would save it) gets no statistics for that iteration."""
    root = tmp_path / "verl"
    shutil.copytree(roots["timeline_verl"], root)
    actor = root / "global_step_2" / "actor"
    for f in sorted(actor.glob("optim_world_size_*_rank_*.pt")):
        state = torch.load(f, weights_only=False)
        params = state["param_groups"][0]["params"]
        state["param_groups"] = [dict(state["param_groups"][0], params=params[:5]),
                                 dict(state["param_groups"][0], params=params[5:])]
        torch.save(state, f)
    _plan, result = _result(root)
    assert {m.exp_avg_sq_mean[1] for m in result.moments} == {None}
    assert all(m.exp_avg_sq_mean[0] is not None for m in result.moments)
    assert any("2 param groups, where verl builds one" in note for note in result.notes)


def test_megatron_flags_and_numbers(gen, megatron_root):
    """megatron-core on gloo: layers are stored stacked (``decoder.layers.<x>`` with a leading layer
    axis); the timeline follows each layer's slice, and torch's DCP loader, sliced the same way, must
    give the same numbers."""
    plan, result = _result(megatron_root)
    assert result.kind == "megatron" and result.iterations == list(range(1, gen.STEPS + 1))
    names = [t.name for t in plan.tensors]
    assert "decoder.layers.1.self_attention.linear_qkv.weight" in names
    frozen = [n for n in names if n.startswith(gen.MEGATRON_FROZEN_PREFIX)]
    moving = [n for n in names if n not in frozen]
    assert len(frozen) == 6
    expected = {("frozen", 2, n) for n in frozen} | {("exploding", gen.SPIKE_STEP, n) for n in moving}
    expected.add(("nan", gen.NAN_STEP, gen.MEGATRON_NAN_TENSOR))
    assert _flag_set(result) == expected
    assert "no Adam exp_avg_sq" in result.optimizer_note

    stored = [_dcp_tensors(path) for _step, path in _steps(megatron_root, "megatron")]

    def per_layer(state: dict) -> dict:
        out = {}
        for key, value in state.items():
            if key.startswith("decoder.layers."):
                for layer in range(value.shape[0]):
                    out[key.replace("decoder.layers.", f"decoder.layers.{layer}.", 1)] = value[layer]
            else:
                out[key] = value
        return out

    states = [per_layer(s) for s in stored]
    for series in result.tensors:
        _assert_series(series, _expected_series(states, [series.name]))
    for module in result.modules:
        _assert_series(module, _expected_series(states, [n for n in names if module_of(n)[0] == module.name]))


def test_without_the_faulty_steps_nothing_is_flagged(roots):
    _plan, result = _result(roots["timeline_hf"], iterations="1:4", include=("model.layers.0.*",))
    assert result.flags == []


# --- numbers equal torch on torch-loaded tensors ------------------------------------------------


@pytest.mark.parametrize("kind", ["dcp", "fsdp2", "hf"])
def test_numbers_equal_torch(kind, roots, dcp_run, hf_run, fsdp2_run):
    plan, result = {"dcp": dcp_run, "fsdp2": fsdp2_run, "hf": hf_run}[kind]
    root = roots[f"timeline_{kind}"]
    load = _hf_tensors if kind == "hf" else _dcp_tensors
    states = [load(path) for _step, path in _steps(root, "hf" if kind == "hf" else "dcp")]
    names = [t.name for t in plan.tensors]
    for series in result.tensors:
        _assert_series(series, _expected_series(states, [series.name]))
    for module in result.modules:
        members = [n for n in names if module_of(n)[0] == module.name]
        assert members, module.name
        _assert_series(module, _expected_series(states, members))
    for layer in result.layers:
        _assert_series(layer, _expected_series(states, [n for n in names if n.startswith(layer.name + ".")]))
    _assert_series(result.model, _expected_series(states, names))


@pytest.mark.parametrize("kind", ["dcp", "fsdp2"])
def test_dcp_adam_statistics_equal_torch(gen, roots, dcp_run, fsdp2_run, kind):
    plan, result = dcp_run if kind == "dcp" else fsdp2_run
    # the LR each save recorded for its next step: the spike is scheduled after step SPIKE_STEP - 1
    steps = result.iterations[:-1] if kind == "dcp" else result.iterations
    expected_lr = [gen.LR * (gen.SPIKE_FACTOR if s == gen.SPIKE_STEP - 1 else 1.0) for s in steps]
    if kind == "dcp":
        expected_lr.append(gen.LR)  # the resumed save carries step RESUME_FROM's scheduler
    assert result.lr == pytest.approx(expected_lr, rel=1e-12)
    assert plan.eps == 1e-8
    states = [_dcp_tensors(path) for _step, path in _steps(roots[f"timeline_{kind}"], "dcp")]
    trained = [t.name for t in plan.tensors if not t.name.startswith(gen.FROZEN_PREFIX)]
    assert sorted(m.name for m in result.moments) == sorted(trained)
    for m in result.moments:
        for k, state in enumerate(states):
            v = state[f"optimizer.state.{m.name}.exp_avg_sq"].double()
            assert m.exp_avg_sq_mean[k] == pytest.approx(float(v.mean()), rel=REL)
            step = result.lr[k] / (math.sqrt(float(v.mean())) + 1e-8)
            assert m.step_size_mean[k] == pytest.approx(step, rel=REL)
    attn = next(m for m in result.moment_modules if m.name == "model.layers.0.self_attn")
    vs = [torch.cat([states[0][f"optimizer.state.model.layers.0.self_attn.{p}_proj.weight.exp_avg_sq"].flatten()
                     for p in "qkvo"]).double()]
    assert attn.exp_avg_sq_mean[0] == pytest.approx(float(vs[0].mean()), rel=REL)


def test_hf_trainer_lr_from_scheduler_pt_and_optimizer_skipped(gen, roots, hf_run):
    _plan, result = hf_run
    lrs = [torch.load(path / "scheduler.pt", weights_only=True)["_last_lr"][0]
           for _step, path in _steps(roots["timeline_hf"], "hf")]
    assert result.lr == lrs and lrs[gen.SPIKE_STEP - 2] == pytest.approx(gen.LR * gen.SPIKE_FACTOR)
    # a frozen layer is left out of the optimizer and optimizer.pt does not say which: no names, refused
    assert result.moments == [] and "saved groups of [12] parameters, expected [16, 5]" in result.optimizer_note


def test_sample_reads_a_deterministic_subset(gen, roots):
    plan, result = _result(roots["timeline_dcp"], sample=3, optimizer=False)
    assert any("sampled" in note for note in result.notes)
    embed = next(t for t in plan.tensors if t.name == gen.NAN_TENSOR)
    assert embed.rows is not None and sum(hi - lo for lo, hi in embed.rows) == 3
    assert embed.rows[-1][1] == embed.shape[0]  # the runs span the whole tensor, last row included
    states = [_dcp_tensors(path) for _step, path in _steps(roots["timeline_dcp"], "dcp")]
    picked = [{gen.NAN_TENSOR: torch.cat([s[gen.NAN_TENSOR][lo:hi] for lo, hi in embed.rows])} for s in states]
    series = next(s for s in result.tensors if s.name == gen.NAN_TENSOR)
    _assert_series(series, _expected_series(picked, [gen.NAN_TENSOR]))
    assert series.nan[gen.NAN_STEP - 1] == 1  # the NaN row is the last row: the sample keeps it
    again = _result(roots["timeline_dcp"], sample=3, optimizer=False)[1]
    assert again.to_json()["tensors"] == result.to_json()["tensors"]


@pytest.mark.parametrize("root", ["timeline_hf", "timeline_dcp"])
@pytest.mark.parametrize("sample", [None, 3])
def test_tensors_read_as_one_run_of_bytes_give_what_the_reader_gives(roots, root, sample, monkeypatch):
    """The engine reads a tensor stored as one run of bytes straight from its file (located once per
    run), block by block, and anything else through the reader: both give the same numbers."""
    import ckptscope.ops.timeline.engine as engine

    direct = _result(roots[root], sample=sample, optimizer=False)[1].to_json()
    monkeypatch.setattr(engine, "_run_of", lambda *args: None)
    through_reader = _result(roots[root], sample=sample, optimizer=False)[1].to_json()
    assert direct == through_reader


def test_threshold_and_factor_options(gen, roots):
    # a factor above the spike: no exploding flags; everything else unchanged
    _plan, result = _result(roots["timeline_hf"], options=TimelineOptions(explode_factor=1e6))
    assert {f.kind for f in result.flags} == {"frozen", "nan"}


def test_cancel_and_a_truncated_file_stop_the_workers(roots, tmp_path):
    """The worker threads stop on cancellation, and a read that fails in one of them (a file cut
    short after its header was read) reaches the caller as the one clear error."""
    plan = build_timeline_plan(roots["timeline_hf"], optimizer=False)
    try:
        result = run_timeline(plan, cancelled=lambda: True)
    finally:
        plan.close()
    assert any("cancelled" in note for note in result.notes) and result.bytes_read == 0

    root = tmp_path / "run"
    shutil.copytree(roots["timeline_hf"], root)
    last = max((p for p in root.iterdir() if p.name.startswith("checkpoint-")), key=lambda p: int(p.name.split("-")[1]))
    shard = max(last.glob("*.safetensors"), key=lambda f: f.stat().st_size)
    plan = build_timeline_plan(root, optimizer=False)
    os.truncate(shard, shard.stat().st_size - 64)
    seen = []
    try:
        with pytest.raises(CkptError, match="truncated"):
            run_timeline(plan, progress=lambda done, total: seen.append((done, total)),
                         options=TimelineOptions(workers=2))
    finally:
        plan.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("ckptscope-timeline")]


def test_module_grouping():
    assert module_of("model.layers.0.self_attn.q_proj.weight") == ("model.layers.0.self_attn", "model.layers.0")
    assert module_of("decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.weight") == (
        "decoder.layers.3.mlp.experts", "decoder.layers.3")
    assert module_of("model.layers.2.mlp.experts.5.gate_proj.weight") == ("model.layers.2.mlp.experts",
                                                                          "model.layers.2")
    assert module_of("model.embed_tokens.weight") == ("model.embed_tokens", None)
    assert module_of("lm_head.weight") == ("lm_head", None)
    assert module_of("transformer.h.11.attn.c_attn.weight") == ("transformer.h.11.attn", "transformer.h.11")


def test_bad_input(tmp_path, roots):
    with pytest.raises(CkptError, match="not a save directory"):
        build_timeline_plan(tmp_path)
    with pytest.raises(CkptError, match="at least 2 complete iterations"):
        build_timeline_plan(roots["timeline_hf"], iterations="6:")
    with pytest.raises(CkptError, match="1000:5000"):
        build_timeline_plan(roots["timeline_hf"], iterations="a:b")
    with pytest.raises(CkptError, match="--include"):
        build_timeline_plan(roots["timeline_hf"], include=("nothing.*",))


# --- the command line ---------------------------------------------------------------------------


def test_cli_table_json_csv_and_exit_codes(gen, roots):
    root = str(roots["timeline_dcp"])
    human = run_cli("timeline", root)
    assert human.code == 1, human.err
    assert "model.layers.1.self_attn" in human.out and "stale at iteration 7" in human.out
    assert "nan at iteration 3: 1 tensor in model.embed_tokens" in human.out
    data = json.loads(run_cli("timeline", root, "--json").out)
    assert data["iterations"] == [1, 2, 3, 4, 5, 6, 7]
    assert {(f["kind"], f["iteration"]) for f in data["flags"]} == {("frozen", 2), ("nan", 3), ("exploding", 5),
                                                                     ("stale", 7)}
    rows = run_cli("timeline", root, "--csv", "--include", "lm_head.*").out.splitlines()
    assert rows[0] == "level,name,iteration,metric,value"
    assert "tensor,lm_head.weight,5,rel_change," in "\n".join(rows)
    clean = run_cli("timeline", str(roots["timeline_hf"]), "--iterations", "1:4", "--include", "model.layers.0.*")
    assert clean.code == 0 and "flags: none" in clean.out
    for args in (("--iterations", "9:"), ("--json", "--csv")):
        bad = run_cli("timeline", root, *args)
        assert bad.code == 2 and bad.err.count("\n") == 1 and bad.err.startswith("ckptscope: error:"), bad.err
    bad = run_cli("timeline", root, "--sample", "0")  # click's own usage error
    assert bad.code == 2 and "Traceback" not in bad.err
    missing = run_cli("timeline", str(Path(root) / "nope"))
    assert missing.code == 2 and "not a save directory" in missing.err


def test_plot_writes_a_png(roots, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "timeline.png"
    result = run_cli("timeline", str(roots["timeline_dcp"]), "--plot", str(target), "--json")
    assert result.code == 1, result.err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.png"]  # no temporary left behind


def test_plot_without_matplotlib_says_which_extra(roots, tmp_path):
    target = tmp_path / "timeline.png"
    code = ("import sys; sys.modules['matplotlib'] = None; from ckptscope.cli import main; "
            f"main(['timeline', {str(roots['timeline_hf'])!r}, '--plot', {str(target)!r}])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ckptscope: error: --plot needs matplotlib: pip install 'ckptscope[plot]'"
    assert proc.stdout == "" and not target.exists()


def test_runs_without_torch(roots, tmp_path):
    """The timeline reads through ckptscope's own readers (scheduler.pt through the safe unpickler):
    no torch needed, same numbers."""
    import os

    from test_without_torch import BLOCKER

    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    blocked = run_cli("timeline", str(roots["timeline_hf"]), "--json", env=env)
    assert blocked.code == 1, blocked.err
    normal = run_cli("timeline", str(roots["timeline_hf"]), "--json")
    without, full = json.loads(blocked.out), json.loads(normal.out)
    # naming optimizer.pt's positions rebuilds the model with torch: without it, it says so
    assert "needs torch and transformers" in without["optimizer"].pop("note")
    assert "frozen parameters" in full["optimizer"].pop("note")
    assert without == full


def test_an_unreadable_iteration_is_left_out_not_fatal(roots, tmp_path):
    """A crash mid-save past the tracker left a rank file cut short: the root lists the step (its files are
    there) and timeline stopped with exit 2 on it (a probe). It is left out with a note; the others are read."""
    root = tmp_path / "verl"
    shutil.copytree(roots["timeline_verl"], root)
    steps = sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*"))
    last = root / f"global_step_{steps[-1]}" / "actor"
    victim = sorted(last.glob("model_world_size_*_rank_*.pt"))[-1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    plan, result = _result(root)
    assert [i.label for i in plan.iterations] == [str(s) for s in steps[:-1]]
    assert any(n.startswith(f"iteration {steps[-1]} left out: it cannot be read") for n in result.notes), result.notes
    only_two = tmp_path / "two"
    shutil.copytree(root, only_two)
    for step in steps[1:-1]:
        shutil.rmtree(only_two / f"global_step_{step}")
    if len(steps) > 2:
        with pytest.raises(CkptError, match="a timeline needs two"):
            build_timeline_plan(only_two)


def test_timeline_of_a_trainer_lora_run_flags_neither_a_still_lora_a_nor_hides_a_trained_head(tmp_path):
    """A transformers Trainer run of a PEFT LoRA model (checkpoint-N/ each a saved adapter with modules_to_save
    lm_head): every lora_A was flagged frozen at the first step, where lora_B is still zero and A gets no gradient
    by design; the trained lm_head copy was called a base weight and never judged, and an adapter-only save got a
    note about its "0 base weights" (a probe)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                         max_position_embeddings=64, tie_word_embeddings=False))
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                             task_type="CAUSAL_LM", modules_to_save=["lm_head"]))
    ids = torch.randint(0, 64, (16, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": x, "labels": x, "attention_mask": torch.ones(16, dtype=torch.long)} for x in ids]
    out = tmp_path / "run"
    # one warmup step: the first update is at rate 0, so lora_B is still zero at checkpoint-1
    args = TrainingArguments(output_dir=str(out), use_cpu=True, per_device_train_batch_size=4, max_steps=4,
                             save_steps=1, learning_rate=1e-2, report_to=[], seed=0, logging_steps=1,
                             lr_scheduler_type="linear", warmup_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    trainer.save_model(str(out))  # the final adapter in output_dir: the root's "final", opened by default
    listed = json.loads(run_cli("inspect", str(out), "--json").out)
    assert [(i["iteration"], i["opened"]) for i in listed["iterations"]][0] == ("final", True)
    assert listed["path"] == str(out) and listed["format"] == "peft"
    result = run_cli("timeline", str(out), "--json")
    doc = json.loads(result.out)
    moved = {t["name"]: t["rel_change"] for t in doc["tensors"]}
    still_a = [n for n, change in moved.items() if ".lora_A." in n and change[0] == 0]
    assert still_a, moved  # lora_A did stay put in the first step (lora_B was zero)
    assert not any(f["kind"] == "frozen" for f in doc["flags"]), doc["flags"]
    assert result.code == 0, result.out
    assert not any("base weight" in note for note in doc["notes"]), doc["notes"]
    head = next(n for n in moved if "lm_head" in n)
    assert all(change > 0 for change in moved[head][1:])  # the trained copy is followed, not set aside
