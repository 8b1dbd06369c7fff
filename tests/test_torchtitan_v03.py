"""torchtitan 0.3 saves, named as its CheckpointManager writes them (a probe ran torchtitan 0.3.0's own
CheckpointManager, Llama3Model and HF state-dict adapter on two gloo ranks; torchtitan is not a
dependency, so these fixtures are written with the same ``torch.distributed.checkpoint.save`` of the
same flattened keys):

* the output layer is ``lm_head.weight`` (``output.weight`` in 0.2), read as unknown before;
* ``fuse_qkv``: the model is ``FusedQKVLinear`` whose state-dict hook saves ``qkv_linear.wq/wk/wv``,
  while the optimizer keeps its state on the fused ``qkv_linear.wqkv.weight`` (rows grouped per KV
  head: the group's query heads, then its key, then its value);
* ``last_save_in_hf``: the last step is HF safetensors shards + ``model.safetensors.index.json`` (written
  after the shards) beside the ``sharded/`` pieces, and ``_find_load_step`` resumes only from a step
  with ``.metadata`` or that index.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

DIM, HEADS, KV_HEADS, LAYERS, VOCAB, HIDDEN = 32, 4, 2, 2, 64, 96
HEAD_DIM = DIM // HEADS


def _model(step: int) -> dict[str, "torch.Tensor"]:
    gen = torch.Generator().manual_seed(step)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    sd = {"tok_embeddings.weight": rand(VOCAB, DIM), "norm.weight": rand(DIM), "lm_head.weight": rand(VOCAB, DIM)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        sd.update({p + "attention.qkv_linear.wq.weight": rand(HEADS * HEAD_DIM, DIM),
                   p + "attention.qkv_linear.wk.weight": rand(KV_HEADS * HEAD_DIM, DIM),
                   p + "attention.qkv_linear.wv.weight": rand(KV_HEADS * HEAD_DIM, DIM),
                   p + "attention.wo.weight": rand(DIM, DIM), p + "attention_norm.weight": rand(DIM),
                   p + "feed_forward.w1.weight": rand(HIDDEN, DIM), p + "feed_forward.w2.weight": rand(DIM, HIDDEN),
                   p + "feed_forward.w3.weight": rand(HIDDEN, DIM), p + "ffn_norm.weight": rand(DIM)})
    return sd


def _fused_qkv(wq, wk, wv):
    """The parameter ``FusedQKVLinear`` trains: per KV group, its query heads, its key, its value."""
    per = HEADS // KV_HEADS
    q = wq.reshape(KV_HEADS, per, HEAD_DIM, DIM)
    return torch.cat([q, wk.reshape(KV_HEADS, 1, HEAD_DIM, DIM), wv.reshape(KV_HEADS, 1, HEAD_DIM, DIM)],
                     dim=1).reshape(-1, DIM)


def _dcp_step(path: Path, step: int) -> None:
    """``dcp.save(CheckpointManager._flattened_model_states_sd())``: model keys at the top, the flattened
    optimizer (``optimizer.state.<param fqn>.exp_avg``), ``lr_scheduler``, ``train_state``."""
    model = _model(step)
    params = {name: value for name, value in model.items() if ".qkv_linear.w" not in name}
    for i in range(LAYERS):
        p = f"layers.{i}.attention.qkv_linear."
        params[p + "wqkv.weight"] = _fused_qkv(model[p + "wq.weight"], model[p + "wk.weight"], model[p + "wv.weight"])
    state = dict(model)
    for name, value in params.items():
        state[f"optimizer.state.{name}.step"] = torch.tensor(float(step))
        state[f"optimizer.state.{name}.exp_avg"] = value * 1e-3
        state[f"optimizer.state.{name}.exp_avg_sq"] = value.square() * 1e-6 + step * 1e-8
        state[f"optimizer.param_groups.{name}.lr"] = 1e-3
    state["lr_scheduler"] = {"last_epoch": step}
    state["train_state"] = {"step": torch.tensor(step, dtype=torch.int32), "ntokens_seen": torch.tensor(64 * step)}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)


def _hf_step(path: Path, step: int, *, index: bool = True) -> None:
    """``last_save_in_hf``: torchtitan's Llama3 adapter names, two consolidated shards, then the index."""
    from safetensors.torch import save_file

    model = _model(step)
    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    hf = {}
    for name, value in model.items():
        if name in names:
            hf[names[name]] = value
            continue
        layer, rest = name.split(".", 2)[1], name.split(".", 2)[2]
        hf_rest = {"attention.qkv_linear.wq.weight": "self_attn.q_proj.weight",
                   "attention.qkv_linear.wk.weight": "self_attn.k_proj.weight",
                   "attention.qkv_linear.wv.weight": "self_attn.v_proj.weight",
                   "attention.wo.weight": "self_attn.o_proj.weight", "attention_norm.weight": "input_layernorm.weight",
                   "feed_forward.w1.weight": "mlp.gate_proj.weight", "feed_forward.w2.weight": "mlp.down_proj.weight",
                   "feed_forward.w3.weight": "mlp.up_proj.weight",
                   "ffn_norm.weight": "post_attention_layernorm.weight"}[rest]
        hf[f"model.layers.{layer}.{hf_rest}"] = value
    path.mkdir(parents=True)
    (path / "sharded").mkdir()
    first = {k: v.contiguous() for k, v in hf.items() if not k.startswith(("lm_head", "model.norm", "model.layers.1."))}
    second = {k: v.contiguous() for k, v in hf.items() if k not in first}
    weight_map = {}
    for number, part in ((1, first), (2, second)):
        shard = f"model-0000{number}-of-00002.safetensors"
        save_file(part, str(path / shard))
        weight_map.update(dict.fromkeys(part, shard))
    if index:
        total = sum(v.numel() * v.element_size() for v in hf.values())
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                       "weight_map": weight_map}))


@pytest.fixture(scope="module")
def titan03(tmp_path_factory) -> Path:
    """``checkpoint/`` of a run with DCP saves at steps 5 and 10 and the HF last save at 12."""
    root = tmp_path_factory.mktemp("titan03") / "checkpoint"
    for step in (5, 10):
        _dcp_step(root / f"step-{step}", step)
    _hf_step(root / "step-12", 12)
    return root


def _model_params() -> int:
    return sum(v.numel() for v in _model(0).values())


def test_lm_head_is_the_model_output_layer(titan03, cli):
    """0.3 names the output layer lm_head: it was 'unknown, never exported' and left out of the count."""
    result = cli("inspect", str(titan03 / "step-10"))
    assert result.code == 0, result.err
    assert f"({_model_params():,}) in the model, torchtitan names" in result.out
    assert "unknown" not in result.out
    doc = json.loads(cli("inspect", str(titan03 / "step-10"), "--json").out)
    roles = {t["name"]: t["role"] for t in doc["tensors"]}
    assert roles["lm_head.weight"] == "model"
    assert roles["layers.0.attention.qkv_linear.wq.weight"] == "model"
    assert roles["optimizer.state.layers.0.attention.qkv_linear.wqkv.weight.exp_avg_sq"] == "optimizer"


def test_convert_says_torchtitan_names_have_no_mapping_before_unknown_entries(titan03, cli, tmp_path):
    """The refusal names the reason (no mapping for torchtitan names), not 'pass --skip-unknown', which
    only led to that reason a second run later; also with an entry that is neither model nor state."""
    step = tmp_path / "step-10"
    state = {name: value for name, value in _model(10).items()}
    state["probe_extra.scale"] = torch.ones(3)
    dcp.save(state, checkpoint_id=str(step), no_dist=True)
    for source in (titan03 / "step-10", step):
        for target in ("hf", "mcore"):
            result = cli("convert", str(source), str(tmp_path / f"out-{target}"), "--to", target)
            assert result.code == 2 and "Traceback" not in result.err
            assert "torchtitan names" in result.err and "have no HF or Megatron-Core mapping" in result.err
            assert "--skip-unknown" not in result.err
            assert not (tmp_path / f"out-{target}").exists()


def test_timeline_says_the_fused_qkv_optimizer_state_is_left_out(titan03, cli):
    result = cli("timeline", str(titan03), "--iterations", "5:10", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    followed = {t["name"] for t in doc["tensors"]} if isinstance(doc.get("tensors"), list) else None
    notes = " ".join(doc["notes"])
    assert "2 saved exp_avg_sq entries name no tensor of the model" in notes
    assert "qkv_linear.wqkv.weight.exp_avg_sq" in notes
    if followed is not None:
        assert "lm_head.weight" in followed


def test_timeline_across_the_hf_last_save_names_the_change(titan03, cli):
    """step-12 is in HF names: the one name both share (lm_head.weight) is no timeline of the model."""
    result = cli("timeline", str(titan03))
    assert result.code == 2 and "Traceback" not in result.err
    assert "name their tensors differently" in result.err
    assert "iterations 5 to 10 have torchtitan names; iteration 12 has hf names" in result.err
    assert "--iterations 5:10" in result.err
    assert cli("timeline", str(titan03), "--iterations", "5:10").code == 0


def test_hf_last_save_without_its_index_is_not_resumed_from(titan03, cli, tmp_path):
    """torchtitan resumes from the newest step with .metadata or the HF index: shards alone are a save
    cut short, so the root's default is step-10 (it was step-12, 'ok')."""
    import shutil

    root = tmp_path / "checkpoint"
    shutil.copytree(titan03, root)
    whole = json.loads(cli("check", str(root), "--json").out)
    assert whole["target"] == "step-12"
    (root / "step-12" / "model.safetensors.index.json").unlink()
    result = cli("check", str(root), "--json")
    assert result.code == 0, result.out
    doc = json.loads(result.out)
    assert doc["layout"] == "torchtitan checkpoint folder (DCP, newest complete: step-10)"
    assert doc["target"] == "step-10"


def test_diff_refuses_a_side_it_cannot_read(titan03, cli, tmp_path):
    """A step without .metadata and an HF save missing the shard with lm_head are damaged inputs (exit 2,
    one line), not 'every tensor only in A' or a tied head compared with the embedding (exit 1)."""
    import shutil

    no_meta = tmp_path / "step-10"
    shutil.copytree(titan03 / "step-10", no_meta)
    (no_meta / ".metadata").unlink()
    result = cli("diff", str(titan03 / "step-5"), str(no_meta))
    assert result.code == 2 and "Traceback" not in result.err
    assert "no tensor can be read" in result.err and ".metadata" in result.err
    lost = tmp_path / "step-12"
    shutil.copytree(titan03 / "step-12", lost)
    (lost / "model-00002-of-00002.safetensors").unlink()
    result = cli("diff", str(titan03 / "step-12"), str(lost))
    assert result.code == 2 and "Traceback" not in result.err
    assert "model-00002-of-00002.safetensors: not found" in result.err
    assert "tied" not in result.out + result.err
