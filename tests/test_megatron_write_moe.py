"""The Megatron writers on MoE models (Mixtral, Qwen2-MoE with a gated shared expert, Qwen3-MoE),
checked against megatron-core itself and round-tripped from transformers checkpoints.

* torch_dist: a tiny megatron-core GPTModel (local spec with ``num_experts``: SequentialMLP experts)
  gets random weights; its TP=1 state, names in the OutTensor convention, goes through
  ``write_torch_dist``. Keys, shapes, dtypes, chunks and ShardedObjects equal megatron-core's own
  ``dist_checkpointing.save`` of the same model, and a fresh MoE GPTModel loads it bitwise.
* legacy ``torch``: every rank file (TP=2, EP=2, PP=2, TP=2 with expert TP 1) equals, key by key
  (order included) and bitwise, what megatron-core's own model of that rank gives from
  ``state_dict_for_save_checkpoint()`` after loading the torch_dist dir written here
  (sample_ckpts/make_moe_samples.py, 2 gloo ranks).
* ``verify``: HF (transformers ``save_pretrained``) -> Megatron-Core -> HF is bit exact.

The torch_dist read-back through the mapping layer needs the local spec's torch_dist name of a MoE
layer's norm (``mlp.linear_fc1.layer_norm_weight``, which megatron-core writes) among the MoE norm
rule's Megatron aliases; until ckptscope/mappings/schemas.py has it those tests are expected to fail
(strict xfail, so they turn into failures the day the alias lands and the marker must go).
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from streaming_producer import Producer as StreamingProducer

from ckptscope.core.errors import CkptError
from ckptscope.formats.megatron.dist_writer import OutTensor, legacy_rank_dir, write_torch_dist, write_torch_legacy
from ckptscope.formats.registry import open_checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_ckpts"
VARIANTS = {
    "mixtral": {"kind": "mixtral"},
    "qwen2_moe": {"kind": "qwen2_moe"},
    "qwen3_moe": {"kind": "qwen3_moe"},
    "qwen3_moe_expert_bias": {"kind": "qwen3_moe", "expert_bias": True},
}
KINDS = ("mixtral", "qwen2_moe", "qwen3_moe")
LOCAL_NORM_ON_DISK = "mlp.linear_fc1.layer_norm_weight"


def _mapping_reads_local_moe_norm() -> bool:
    from ckptscope.mappings.schemas import SCHEMAS

    return all(any(alias.endswith(LOCAL_NORM_ON_DISK) for rule in SCHEMAS[kind] for alias in rule.mcore
                   if any("post_attention_layernorm" in h for h in rule.hf)) for kind in KINDS)


needs_local_moe_norm_alias = pytest.mark.xfail(
    not _mapping_reads_local_moe_norm(), strict=True, raises=(CkptError, AssertionError),
    reason="mappings/schemas.py MOE_NORM lacks the alias decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight "
           "(the local spec's torch_dist name of a MoE layer's norm)")


def moe_module():
    """sample_ckpts/make_moe_samples.py, importable by name so spawned ranks find it too."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_moe_samples")


def out_name(name: str) -> str:
    """A state_dict name in the OutTensor convention (schemas.py rule.mcore[0]): the input norm under
    its TE name; a MoE layer's norm stays ``pre_mlp_layernorm``."""
    return name.replace(".input_layernorm.", ".self_attention.linear_qkv.layer_norm_")


def Producer(state: dict, rename=out_name) -> StreamingProducer:
    return StreamingProducer(state, rename)


def dcp_summary(path: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(path)).read_metadata()
    summary = {}
    for key, entry in md.state_dict_metadata.items():
        if hasattr(entry, "chunks"):
            summary[key] = (tuple(entry.size), entry.properties.dtype,
                            sorted((tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks))
        else:
            summary[key] = "bytes"
    return summary


@pytest.fixture(scope="module")
def gen():
    return moe_module()


@pytest.fixture(scope="module")
def models(gen):
    """variant -> (Megatron args, TP=1 state_dict_for_save_checkpoint() with random weights)."""
    out = {}
    for seed, (variant, spec) in enumerate(VARIANTS.items()):
        args = gen.moe_args(spec["kind"], expert_bias=spec.get("expert_bias", False))
        out[variant] = (args, gen.random_moe_state(args, seed=seed))
    return out


@pytest.fixture(scope="module")
def dist_dirs(models, gen, tmp_path_factory):
    """variant -> (ckptscope's torch_dist dir, megatron-core's own save of the same model, Producer)."""
    root = tmp_path_factory.mktemp("moe_write")
    out = {}
    for variant, (args, state) in models.items():
        producer = Producer(state)
        mine = root / f"mine_{variant}" / "iter_0000005"
        seen: list[int] = []
        write_torch_dist(mine, producer.tensors, args=vars(args), iteration=gen.ITERATION, progress=seen.append)
        assert sum(seen) == sum(v.numel() * v.element_size() for v in state.values() if v is not None)
        real = gen.save_dist_moe(state, args, root / f"real_{variant}" / "iter_0000005")
        out[variant] = (mine, real, producer)
    return out


# --- torch_dist -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_moe_torch_dist_is_what_megatron_core_saves(dist_dirs, models, variant):
    from torch.distributed.checkpoint import FileSystemReader

    mine, real, producer = dist_dirs[variant]
    producer.check_streamed()
    summary = dcp_summary(mine)
    assert summary == dcp_summary(real)
    args = models[variant][0]
    layers, experts, moe_ffn, hidden = args.num_layers, args.num_experts, args.moe_ffn_hidden_size, args.hidden_size
    fc1 = summary["decoder.layers.mlp.experts.experts.linear_fc1.weight"]
    assert fc1[0] == (layers, experts, 2 * moe_ffn, hidden)  # the expert axis right after the layer axis
    assert summary["decoder.layers.mlp.router.weight"][0] == (layers, experts, hidden)
    assert f"decoder.layers.mlp.experts.experts.linear_fc2._extra_state/shard_1.3_{layers}.{experts}" in summary
    assert sorted(p.name for p in mine.iterdir()) == sorted(p.name for p in real.iterdir())
    assert (mine / "metadata.json").read_bytes() == (real / "metadata.json").read_bytes()
    assert torch.load(mine / "common.pt", weights_only=False) == torch.load(real / "common.pt", weights_only=False)
    md_mine, md_real = (FileSystemReader(str(p)).read_metadata() for p in (mine, real))
    plan_keys = [sorted((i.index.fqn, tuple(i.index.offset or ())) for i in md.all_local_plans[0].items)
                 for md in (md_mine, md_real)]
    assert plan_keys[0] == plan_keys[1]
    for index, info in md_mine.storage_data.items():
        if "/shard_" in index.fqn:
            raw = (mine / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
            assert torch.load(io.BytesIO(raw), weights_only=False) == [None]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_moe_torch_dist_loads_bitwise_into_a_fresh_moe_gptmodel(dist_dirs, models, gen, variant):
    args, state = models[variant]
    loaded = gen.load_dist_moe(args, dist_dirs[variant][0])
    assert list(loaded) == list(state)
    for name, value in state.items():
        if value is None:
            assert loaded[name] is None, name
        else:
            assert loaded[name].dtype == value.dtype and torch.equal(loaded[name], value), name


def _dist_view(name: str) -> tuple[str, int | None]:
    """Where a TP=1 state_dict name shows in ckptscope's per-layer torch_dist views: (view, expert)."""
    name = out_name(name).replace(".pre_mlp_layernorm.", "." + LOCAL_NORM_ON_DISK.removesuffix("weight"))
    if ".mlp.experts.local_experts." in name:
        head, rest = name.split(".mlp.experts.local_experts.")
        expert, tail = rest.split(".", 1)
        return f"{head}.mlp.experts.experts.{tail}", int(expert)
    return name, None


@pytest.mark.parametrize("variant", ["qwen2_moe", "qwen3_moe_expert_bias"])
def test_moe_torch_dist_reads_back_with_ckptscope(dist_dirs, models, gen, variant):
    _, state = models[variant]
    with open_checkpoint(dist_dirs[variant][0]) as reader:
        assert reader.format_name == "megatron_dist"
        assert reader.index().metadata["iteration"] == gen.ITERATION
        checked = 0
        for name, value in state.items():
            if value is None:
                continue
            view, expert = _dist_view(name)
            got = reader.read(view)
            np.testing.assert_array_equal(got if expert is None else got[expert], value.numpy(), strict=True)
            checked += 1
        assert checked == len(dist_dirs[variant][2].tensors)


@needs_local_moe_norm_alias
@pytest.mark.parametrize("variant", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_torch_dist_maps_to_hf_names(dist_dirs, models, variant):
    from ckptscope.mappings.resolve import config_from_index, shapes_of, to_hf

    with open_checkpoint(dist_dirs[variant][0]) as reader:
        index = reader.index()
        view = to_hf(shapes_of(index.logical_tensors()), config_from_index(index), variant)
    assert view.unmapped == []
    experts = models[variant][0].num_experts
    assert sum(".experts." in n for n in view.recipes) == 2 * 3 * experts  # 2 layers, gate/up/down
    assert "model.layers.1.post_attention_layernorm.weight" in view.recipes


# --- verify from transformers checkpoints ---------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dirs(gen, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_moe")
    return {kind: gen.write_hf_moe(kind, out) for kind in KINDS}


LEGACY_LAYOUTS = [(1, 1), (2, 1), (2, 2)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tp,pp", LEGACY_LAYOUTS)
def test_moe_round_trip_through_torch_is_bit_exact(hf_dirs, kind, tp, pp):
    from ckptscope.ops.verify import verify_round_trip

    report = verify_round_trip(hf_dirs[kind], via="mcore", tp=tp, pp=pp, ckpt_format="torch")
    summary = report.summary()
    assert report.identical, [r.to_json() for r in report.results if r.differs]
    assert summary["only_a"] == summary["only_b"] == 0
    assert summary["equal"] == summary["compared"] > 40


@needs_local_moe_norm_alias
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tp", [1, 2])
def test_moe_round_trip_through_torch_dist_is_bit_exact(hf_dirs, kind, tp):
    from ckptscope.ops.verify import verify_round_trip

    report = verify_round_trip(hf_dirs[kind], via="mcore", tp=tp, ckpt_format="torch_dist")
    summary = report.summary()
    assert report.identical, [r.to_json() for r in report.results if r.differs]
    assert summary["only_a"] == summary["only_b"] == 0
    assert summary["equal"] == summary["compared"] > 40


def test_moe_verify_cli_torch_tp2_prints_identical(hf_dirs, cli):
    result = cli("verify", str(hf_dirs["qwen2_moe"]), "--ckpt-format", "torch", "--tp", "2")
    assert result.code == 0, result.err
    assert "identical" in result.out and "tp 2" in result.out


@needs_local_moe_norm_alias
def test_moe_verify_cli_torch_dist_prints_identical(hf_dirs, cli):
    result = cli("verify", str(hf_dirs["mixtral"]))
    assert result.code == 0, result.err
    assert "identical" in result.out


# --- legacy torch against megatron-core's own ranks --------------------------------------------------------


@pytest.fixture(scope="module")
def legacy(dist_dirs, models, gen, tmp_path_factory):
    """case name -> (ckptscope's legacy iteration dir, megatron-core's references dir, Producer, case, args)."""
    root = tmp_path_factory.mktemp("moe_legacy")
    references = gen.moe_rank_references({kind: dist_dirs[kind][0] for kind in KINDS}, root / "references")
    out = {}
    for case in gen.CASES:
        _, state = models[case["kind"]]
        args = vars(gen.moe_args(case["kind"], tp=case["tp"], pp=case["pp"], ep=case["ep"], etp=case.get("etp")))
        producer = Producer(state)
        iter_dir = root / case["name"] / "iter_0000005"
        write_torch_legacy(iter_dir, producer.tensors, args=args, iteration=gen.ITERATION, tp=case["tp"],
                           pp=case["pp"], ep=case["ep"])
        out[case["name"]] = (iter_dir, references / case["name"], producer, case, args)
    return out


@pytest.mark.parametrize("case", ["tp2_qwen2_moe", "tp2_mixtral", "ep2_qwen2_moe", "pp2_qwen3_moe",
                                  "tp2_etp1_mixtral"])
def test_moe_legacy_rank_files_equal_megatron_core_per_rank(legacy, gen, case):
    iter_dir, references, producer, spec, args = legacy[case]
    producer.check_streamed()
    ranks = [legacy_rank_dir(t, p, spec["pp"], x, spec["ep"])
             for p in range(spec["pp"]) for x in range(spec["ep"]) for t in range(spec["tp"])]
    assert sorted(p.name for p in iter_dir.iterdir()) == sorted(ranks)
    assert sorted(p.name for p in references.iterdir()) == sorted(ranks)
    for rank in ranks:
        path = iter_dir / rank / "model_optim_rng.pt"
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None
        mine = torch.load(path, weights_only=False)
        expected = torch.load(references / rank / "reference.pt", weights_only=False)["model"]
        assert mine["args"] == argparse.Namespace(**args)
        assert (mine["checkpoint_version"], mine["iteration"]) == (3.0, gen.ITERATION)
        assert list(mine["model"]) == list(expected), rank
        for name, value in expected.items():
            got = mine["model"][name]
            if value is None:
                assert got is None, (rank, name)
            else:
                assert type(got) is torch.Tensor and got.dtype == value.dtype, (rank, name)
                assert torch.equal(got, value), (rank, name)


@pytest.mark.parametrize("case", ["tp2_qwen2_moe", "ep2_qwen2_moe", "tp2_etp1_mixtral"])
def test_moe_legacy_reads_back_whole_with_ckptscope(legacy, models, case):
    """ckptscope's legacy reader merges the TP slices and EP files back into the TP=1 state."""
    iter_dir, _, _, spec, _ = legacy[case]
    _, state = models[spec["kind"]]
    with open_checkpoint(iter_dir) as reader:
        index = reader.index()
        tensors = {n: m for n, m in index.logical_tensors().items() if dict(m.attrs).get("group") == "model"}
        assert set(tensors) == {n for n, v in state.items() if v is not None}
        for name in tensors:
            np.testing.assert_array_equal(reader.read(name), state[name].numpy(), strict=True)


# --- refusals and spellings --------------------------------------------------------------------------------


def _one(name: str, shape: tuple[int, ...]) -> OutTensor:
    return OutTensor(name, shape, "float32", lambda: np.zeros(shape, np.float32))


def _moe(experts: int = 2, layers: int = 1, shared: bool = False) -> list[OutTensor]:
    tensors = [_one("embedding.word_embeddings.weight", (8, 4)), _one("decoder.final_layernorm.weight", (4,))]
    for i in range(layers):
        tensors += [_one(f"decoder.layers.{i}.self_attention.linear_qkv.weight", (6, 4)),
                    _one(f"decoder.layers.{i}.pre_mlp_layernorm.weight", (4,)),
                    _one(f"decoder.layers.{i}.mlp.router.weight", (experts, 4))]
        for e in range(experts):
            tensors += [_one(f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight", (6, 4)),
                        _one(f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight", (4, 3))]
        if shared:
            tensors += [_one(f"decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight", (4, 4)),
                        _one(f"decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight", (4, 2))]
    return tensors


def _drop(tensors: list[OutTensor], part: str) -> list[OutTensor]:
    return [t for t in tensors if part not in t.name]


@pytest.mark.parametrize("tensors,args,message", [
    (_drop(_moe(), ".router."), {}, "without mlp.router.weight"),
    (_drop(_moe(3), "local_experts.1."), {}, "without gaps"),
    (_drop(_moe(), "local_experts.1.linear_fc2"), {}, "does not hold the same tensors as expert 0"),
    ([*_drop(_moe(), "local_experts.1.linear_fc2"),
      _one("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", (4, 5))], {}, "differs from expert 0"),
    ([*_moe(), _one("decoder.layers.0.mlp.linear_fc2.weight", (4, 3))], {}, "dense MLP next to MoE"),
    (_moe(), {"num_experts": 4}, "num_experts=4"),
    ([*_moe(), _one("decoder.layers.0.mlp.experts.linear_fc1.weight0", (6, 4))], {}, "not a dense GPTModel tensor"),
    (_drop(_moe(), "experts.local_experts"), {}, "no routed experts"),
    ([*_drop(_moe(), ".router."), _one("decoder.layers.0.mlp.router.weight", (3, 4))], {}, "one row per expert"),
])
def test_bad_moe_tensor_lists_are_refused_before_writing(tensors, args, message, tmp_path):
    for writer, kwargs in ((write_torch_dist, {}), (write_torch_legacy, {"tp": 1, "pp": 1})):
        with pytest.raises(CkptError, match=message):
            writer(tmp_path / "out", tensors, args=args, iteration=1, **kwargs)
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.p*"))


def test_moe_parallel_refusals(tmp_path):
    with pytest.raises(CkptError, match="expert_model_parallel_size=2"):
        write_torch_legacy(tmp_path, _moe(), args={}, iteration=1, tp=1, pp=1, ep=2)
    with pytest.raises(CkptError, match="expert count divides"):
        write_torch_legacy(tmp_path, _moe(3), args={"expert_model_parallel_size": 2}, iteration=1, tp=1, pp=1, ep=2)
    with pytest.raises(CkptError, match="only 1 or the TP size"):
        write_torch_legacy(tmp_path, _moe(), args={"expert_tensor_parallel_size": 4}, iteration=1, tp=2, pp=1)
    with pytest.raises(CkptError, match="does not split over TP=2"):  # SwiGLU expert fc1: 3 rows per half
        write_torch_legacy(tmp_path, _moe(), args={"swiglu": True}, iteration=1, tp=2, pp=1)
    assert not any(tmp_path.rglob("*.pt"))


def test_moe_norm_in_its_torch_dist_spelling_is_the_same_tensor(models, dist_dirs, tmp_path):
    """A MoE layer's norm handed in as ``mlp.linear_fc1.layer_norm_weight`` (how the local spec's
    torch_dist names it) is the same tensor: the same checkpoint comes out, in both formats."""
    args, state = models["mixtral"]

    def disk_name(name: str) -> str:
        return out_name(name).replace(".pre_mlp_layernorm.", "." + LOCAL_NORM_ON_DISK.removesuffix("weight"))

    write_torch_dist(tmp_path / "dist", Producer(state, disk_name).tensors, args=vars(args), iteration=5)
    assert dcp_summary(tmp_path / "dist") == dcp_summary(dist_dirs["mixtral"][0])
    write_torch_legacy(tmp_path / "legacy", Producer(state, disk_name).tensors, args=vars(args), iteration=5,
                       tp=1, pp=1)
    model = torch.load(tmp_path / "legacy" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)["model"]
    assert list(model) == list(state)
    assert all(torch.equal(model[k], v) for k, v in state.items() if v is not None)


def test_moe_te_spec_names(models, tmp_path):
    """TE spec (no TE installed here to compare with): the input norm fused into linear_qkv, the MoE
    norm a module of its own (``pre_mlp_layernorm`` in both formats), empty uint8 extra states."""
    args, state = models["qwen2_moe"]
    write_torch_legacy(tmp_path / "legacy", Producer(state).tensors, args=vars(args), iteration=1, tp=1, pp=1,
                       spec="te")
    model = torch.load(tmp_path / "legacy" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)["model"]
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in model
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in model
    assert "decoder.layers.0.input_layernorm.weight" not in model
    extra = model["decoder.layers.0.mlp.experts.local_experts.3.linear_fc2._extra_state"]
    assert extra.dtype == torch.uint8 and extra.numel() == 0
    write_torch_dist(tmp_path / "dist", Producer(state).tensors, args=vars(args), iteration=1, spec="te")
    summary = dcp_summary(tmp_path / "dist")
    assert "decoder.layers.pre_mlp_layernorm.weight" in summary
    assert "decoder.layers." + LOCAL_NORM_ON_DISK not in summary


# --- expert parallelism from the command line ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tp,ep", [(1, 2), (2, 2), (1, 4)])
def test_moe_round_trip_with_expert_parallel_ranks_is_bit_exact(hf_dirs, kind, tp, ep):
    from ckptscope.ops.verify import verify_round_trip

    report = verify_round_trip(hf_dirs[kind], via="mcore", tp=tp, ep=ep, ckpt_format="torch")
    assert report.identical, [r.to_json() for r in report.results if r.differs]
    assert report.summary()["equal"] == report.summary()["compared"] > 40
    assert f"ep {ep}" in report.b


def test_convert_ep_writes_one_dir_per_expert_rank_with_its_experts(hf_dirs, cli, tmp_path):
    dst = tmp_path / "mc"
    result = cli("convert", str(hf_dirs["mixtral"]), str(dst), "--to", "mcore", "--ckpt-format", "torch",
                 "--tp", "2", "--ep", "2")
    assert result.code == 0, result.err
    iter_dir = dst / "iter_0000000"
    assert sorted(p.name for p in iter_dir.iterdir()) == [legacy_rank_dir(t, 0, 1, e, 2)
                                                           for t in range(2) for e in range(2)]
    for e in range(2):
        state = torch.load(iter_dir / legacy_rank_dir(0, 0, 1, e, 2) / "model_optim_rng.pt", weights_only=False)
        assert state["args"].expert_model_parallel_size == 2
        local = sorted({k.split("local_experts.")[1].split(".")[0] for k in state["model"] if "local_experts." in k})
        assert local == ["0", "1"]  # 4 experts over 2 ranks: local ids 0-1 on each


@pytest.mark.parametrize("argv,message", [
    (["--ep", "2"], "--ckpt-format torch"),                          # torch_dist does not depend on EP
    (["--ep", "3", "--ckpt-format", "torch"], "divides"),            # 4 experts
])
def test_bad_expert_parallel_requests_exit_2(hf_dirs, cli, tmp_path, argv, message):
    result = cli("convert", str(hf_dirs["mixtral"]), str(tmp_path / "x"), "--to", "mcore", *argv)
    assert result.code == 2 and message in result.err and "Traceback" not in result.err
    assert not (tmp_path / "x").exists()


def test_expert_parallel_on_a_dense_model_exits_2(cli, tmp_path):
    result = cli("convert", str(SAMPLES / "hf_llama_gqa"), str(tmp_path / "x"), "--to", "mcore",
                 "--ckpt-format", "torch", "--ep", "2")
    assert result.code == 2 and "MoE" in result.err


# --- Transformer Engine spec naming ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt,tp", [("torch_dist", 1), ("torch", 2)])
def test_moe_round_trip_through_te_spec_names_is_bit_exact(hf_dirs, kind, fmt, tp):
    from ckptscope.ops.verify import verify_round_trip

    report = verify_round_trip(hf_dirs[kind], via="mcore", tp=tp, spec="te", ckpt_format=fmt)
    assert report.identical, [r.to_json() for r in report.results if r.differs]
    assert report.summary()["equal"] == report.summary()["compared"] > 40


def test_te_spec_torch_dist_names_the_moe_norm_and_extra_states_as_te_does(hf_dirs, cli, tmp_path):
    """With TE layers a MoE layer's norm is ``pre_mlp_layernorm`` (no fused LayerNormLinear in front
    of the experts) and each linear's extra state is an empty uint8 tensor (MAPPING.md §1.3)."""
    from ckptscope.formats.dcp.metadata import load_dcp_metadata

    dst = tmp_path / "te"
    result = cli("convert", str(hf_dirs["mixtral"]), str(dst), "--to", "mcore", "--spec", "te")
    assert result.code == 0, result.err
    iter_dir = dst / "iter_0000000"
    metadata = load_dcp_metadata(iter_dir / ".metadata")
    assert "decoder.layers.pre_mlp_layernorm.weight" in metadata.tensors
    assert not any(k.endswith("mlp.linear_fc1.layer_norm_weight") for k in metadata.tensors)
    key, where = next(iter(metadata.bytes_entries.items()))
    assert "_extra_state" in key
    with open(iter_dir / where.file, "rb") as handle:
        handle.seek(where.offset)
        (state,) = torch.load(io.BytesIO(handle.read(where.length)), weights_only=True)
    assert state.dtype == torch.uint8 and state.numel() == 0
