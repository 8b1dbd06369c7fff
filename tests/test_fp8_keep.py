"""``convert --dtype keep`` of FP8 block-scaled weights (DeepSeek-V3: ``float8_e4m3fn`` + ``weight_scale_inv``
per 128x128 block): the FP8 bytes and their scales move together through TP splits, [gate; up] fusion,
MLA pieces and expert stacking, and come back to HF bit for bit; a split or transform that would cut a
scale block is refused with one line.

The fixture is a tiny DeepSeek-V3 built and saved by transformers, quantised with the reference block
formula (tests/blockscaled_fixtures.py). Outputs are judged with safetensors' and torch's own loaders
(raw bytes, not ckptscope's reader) and by transformers' ``from_pretrained`` of the HF result.
"""

from __future__ import annotations

import json

import pytest

from tests.blockscaled_fixtures import write_fp8_deepseek_v3, write_fp8_llama
from tests.conftest import run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

from ckptscope.core.errors import CkptError  # noqa: E402
from ckptscope.ops.convert.execute import execute_convert  # noqa: E402
from ckptscope.ops.convert.plan import plan_convert  # noqa: E402

BLOCK = 128
L1 = "model.layers.1."


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_fp8_deepseek_v3(tmp_path_factory.mktemp("fp8keep") / "hf")


def _raw(path) -> dict[str, tuple[str, tuple, bytes]]:
    """Every tensor of an HF dir as (dtype, shape, bytes), read by safetensors itself."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():
                t = handle.get_tensor(name).contiguous()
                out[name] = (str(t.dtype), tuple(t.shape), t.view(torch.uint8).numpy().tobytes())
    return out


def _convert(src, dst, **kw):
    execute_convert(plan_convert(src, dst, **kw))
    return dst


@pytest.fixture(scope="module")
def legacy_tp2(ds):
    return _convert(ds, ds.parent / "legacy_tp2", to="mcore", ckpt_format="torch", tp=2, spec="te")


def _rank(legacy, t):
    state = torch.load(legacy / "iter_0000000" / f"mp_rank_{t:02d}" / "model_optim_rng.pt", weights_only=False)
    return state["model"]


@pytest.mark.parametrize("fmt", ["torch", "torch_dist", "resharded"])
def test_round_trip_through_megatron_tp2_is_bit_identical(ds, legacy_tp2, tmp_path, fmt):
    if fmt == "torch":
        mcore = legacy_tp2
    elif fmt == "torch_dist":
        mcore = _convert(ds, tmp_path / "dist", to="mcore", tp=2, spec="te")
    else:  # Megatron -> Megatron: TP 2 rank files to TP 1, PP 2, EP 2 rank files
        mcore = _convert(legacy_tp2, tmp_path / "pp2", to="mcore", ckpt_format="torch", pp=2, ep=2, spec="te")
    back = _convert(mcore, tmp_path / "back", to="hf")  # config derived from the Megatron args
    original, written = _raw(ds), _raw(back)
    assert set(written) == set(original)
    assert sum(n.endswith("_scale_inv") for n in written) == 28  # 8 projections in layer 0, 20 in layer 1
    for name, value in original.items():
        assert written[name] == value, name
    config = json.loads((back / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "fp8"
    assert config["quantization_config"]["weight_block_size"] == [BLOCK, BLOCK]


def test_rank_files_hold_their_own_blocks_and_scales(ds, legacy_tp2):
    """Rank t's scales are the original scales of rank t's rows/columns: a column-parallel up
    projection, a row-parallel output projection, SwiGLU fc1 ([gate_t; up_t]) and a routed expert."""
    with safe_open(str(ds / "model.safetensors"), "pt") as handle:
        hf = {n: handle.get_tensor(n) for n in handle.keys()}
    ranks = [_rank(legacy_tp2, t) for t in range(2)]
    cases = {  # Megatron name -> (its HF tensors, [gate; up] when two, and the TP axis)
        "decoder.layers.1.self_attention.linear_q_up_proj.weight": ([L1 + "self_attn.q_b_proj.weight"], 0),
        "decoder.layers.1.self_attention.linear_proj.weight": ([L1 + "self_attn.o_proj.weight"], 1),
        "decoder.layers.0.mlp.linear_fc1.weight": ([f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up")], 0),
        "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight":
            ([f"{L1}mlp.experts.3.{p}_proj.weight" for p in ("gate", "up")], 0),
    }
    for name, (sources, axis) in cases.items():
        for t, state in enumerate(ranks):
            for suffix in ("", "_scale_inv"):  # rank t: the t-th half of each weight and of its scales
                want = torch.cat([hf[source + suffix].chunk(2, axis)[t] for source in sources])
                got = state[name + suffix]
                assert got.dtype == want.dtype and got.shape == want.shape, (name, t, suffix)
                assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), (name, t, suffix)
        assert not torch.equal(ranks[0][name + "_scale_inv"], ranks[1][name + "_scale_inv"]), name
    # replicated down projections keep their partial edge blocks whole on every rank
    kv_down = hf[L1 + "self_attn.kv_a_proj_with_mqa.weight_scale_inv"]
    assert kv_down.shape == (2, 2)
    for state in ranks:
        assert torch.equal(state["decoder.layers.1.self_attention.linear_kv_down_proj.weight_scale_inv"], kv_down)


def test_torch_dist_stores_the_global_scales(ds, tmp_path):
    """torch's own DCP reader: each scale is a global tensor equal to the HF one (fc1 is [gate; up])."""
    import torch.distributed.checkpoint as dcp

    out = _convert(ds, tmp_path / "dist", to="mcore", tp=2, spec="te")
    iter_dir = out / "iter_0000000"
    metadata = dcp.FileSystemReader(str(iter_dir)).read_metadata()
    with safe_open(str(ds / "model.safetensors"), "pt") as handle:
        gate, up = (handle.get_tensor(f"model.layers.0.mlp.{p}_proj.weight_scale_inv") for p in ("gate", "up"))
        q_up = handle.get_tensor(L1 + "self_attn.q_b_proj.weight_scale_inv")
    keys = {"decoder.layers.0.mlp.linear_fc1.weight_scale_inv": torch.cat([gate, up]),
            "decoder.layers.1.self_attention.linear_q_up_proj.weight_scale_inv": q_up}
    state = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in keys.items()}
    assert all(tuple(metadata.state_dict_metadata[k].size) == tuple(v.shape) for k, v in keys.items())
    dcp.load(state, checkpoint_id=str(iter_dir), no_dist=True)
    for key, want in keys.items():
        assert torch.equal(state[key], want), key


def test_transformers_loads_the_round_trip(ds, legacy_tp2, tmp_path):
    """transformers' FP8 loader (dequantising on CPU) on the HF output: nothing missing or unexpected,
    every parameter equal to what it loads from the original, and whole-block weights equal to the
    reference block formula ``float32(w) * scale`` of the original bytes, bit for bit. (Weights with a
    partial edge block, such as ``kv_a_proj_with_mqa``'s 192 rows, are not: transformers' CPU path
    spreads the scale rows evenly, 96 rows each, for the original as for the output.)"""
    from transformers import AutoModelForCausalLM

    back = _convert(legacy_tp2, tmp_path / "back", to="hf", hf_config=ds)
    model, info = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    state = model.state_dict()
    original = AutoModelForCausalLM.from_pretrained(ds, dtype=torch.float32).state_dict()
    assert state.keys() == original.keys()
    assert all(torch.equal(state[k], original[k]) for k in state)
    with safe_open(str(ds / "model.safetensors"), "pt") as handle:
        def reference(name):
            w, s = handle.get_tensor(name), handle.get_tensor(name + "_scale_inv")
            return w.float() * s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)

        for name in (L1 + "self_attn.kv_b_proj.weight", L1 + "self_attn.o_proj.weight",
                     "model.layers.0.mlp.down_proj.weight", L1 + "mlp.shared_experts.up_proj.weight"):
            assert torch.equal(state[name], reference(name)), name
        fused = torch.cat([reference(f"{L1}mlp.experts.2.{p}_proj.weight") for p in ("gate", "up")])
        assert torch.equal(state[L1 + "mlp.experts.gate_up_proj"][2], fused)


def test_hf_reshard_keeps_each_scale_with_its_weight(ds, tmp_path):
    out = _convert(ds, tmp_path / "resharded", to="hf", max_shard_size="200KB")
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 3
    assert _raw(out) == _raw(ds)
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert all(weight_map[n] == weight_map[n.removesuffix("_scale_inv")] for n in weight_map if n.endswith("_scale_inv"))
    assert json.loads((out / "config.json").read_text())["quantization_config"]["weight_block_size"] == [BLOCK, BLOCK]


@pytest.mark.parametrize(("args", "message"), [
    (["--tp", "4", "--spec", "te"], "decoder.layers.0.self_attention.linear_proj.weight: TP 4 gives each rank 64 of "
                                    "its 256 columns (axis 1), not a multiple of the 128-wide FP8 scale block"),
    (["--tp", "2", "--ckpt-format", "torch"],  # the local spec splits MLA's down projections: 192 rows
     "linear_q_down_proj.weight: TP 2 gives each rank 96 of its 192 rows (axis 0), not a multiple of the 128-wide"),
])
def test_a_split_inside_a_scale_block_is_refused(ds, tmp_path, args, message):
    out = tmp_path / "out"
    result = run_cli("convert", str(ds), str(out), "--to", "mcore", *args)
    assert result.code == 2 and message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and "_scale_inv" in result.err
    assert not out.exists()


def test_a_fusion_that_mixes_blocks_is_refused(tmp_path):
    """Llama with hidden 200: q/k/v rows of 50 per head would be interleaved inside 128-row blocks."""
    src = write_fp8_llama(tmp_path / "llama")
    with pytest.raises(CkptError) as refused:
        plan_convert(src, tmp_path / "out", to="mcore")
    assert "linear_qkv.weight: its qkv transform cuts axis 0" in str(refused.value)
    assert "128-wide FP8 scale block" in str(refused.value)


@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_megatron_fp8_reads_dequantised_like_the_hf_source(ds, legacy_tp2, tmp_path, fmt):
    """The readers pair each TP-split weight with its split scales: diff sees the same values as in the
    HF source, and a bfloat16 conversion from Megatron equals the one from HF, tensor for tensor."""
    mcore = legacy_tp2 if fmt == "torch" else _convert(ds, tmp_path / "dist", to="mcore", tp=2, spec="te")
    diff = run_cli("diff", str(ds), str(mcore))
    assert diff.code == 0 and "41 equal, 0 different" in diff.out, diff.out + diff.err
    from_hf = _convert(ds, tmp_path / "from_hf", to="hf", dtype="bfloat16")
    from_mcore = _convert(mcore, tmp_path / "from_mcore", to="hf", dtype="bfloat16", hf_config=ds)
    assert _raw(from_mcore) == _raw(from_hf)
    assert "quantization_config" not in json.loads((from_mcore / "config.json").read_text())


def test_dense_model_through_stacked_torch_dist(tmp_path):
    """A Llama whose q/k/v heads are 128 rows: the qkv interleave moves whole blocks, torch_dist stacks
    the layers ([L, ...] weights and scales), and the round trip is bit-identical."""
    src = write_fp8_llama(tmp_path / "llama", hidden=512, intermediate=512)
    mcore = _convert(src, tmp_path / "dist", to="mcore", tp=2)
    back = _convert(mcore, tmp_path / "back", to="hf", hf_config=src)
    assert _raw(back) == _raw(src)


def test_fused_hf_experts_with_fp8_kept_are_refused(ds, tmp_path):
    """transformers 5.24 on CPU reports fused ``gate_up_proj_scale_inv`` as unexpected and loads the
    experts unscaled; nothing here can check its GPU path, so that output is not written."""
    with pytest.raises(CkptError, match="--hf-experts fused with the FP8 weights kept"):
        plan_convert(ds, tmp_path / "out", to="hf", hf_experts="fused")


def test_vocab_padding_moves_whole_scale_blocks_or_is_refused():
    """A padded FP8 tensor (rows of zeros after the source's): whole padding blocks get zero scales; a
    source whose last block is partial cannot be followed by padding rows inside that block."""
    from ckptscope.mappings.links import Piece, Recipe
    from ckptscope.ops.convert.fp8_keep import scale_recipe

    def padded(rows):
        return Recipe("w", (384, 256), "float8_e4m3fn", [Piece(((0, rows), (0, 256)), "src", ((0, rows), (0, 256)))],
                      ["vocab padding"], fill=[((rows, 384), (0, 256))])

    scales = scale_recipe(padded(256), {"src": (256, 256)}, {"src": "src_scale_inv"}, "float32", (BLOCK, BLOCK))
    assert scales.name == "w_scale_inv" and scales.shape == (3, 2)
    assert scales.pieces == [Piece(((0, 2), (0, 2)), "src_scale_inv", ((0, 2), (0, 2)))]
    assert scales.fill == [((2, 3), (0, 2))]
    with pytest.raises(CkptError, match=r"w: its vocab padding transform cuts axis 0 at 300, inside a 128-wide"):
        scale_recipe(padded(300), {"src": (300, 256)}, {"src": "src_scale_inv"}, "float32", (BLOCK, BLOCK))
