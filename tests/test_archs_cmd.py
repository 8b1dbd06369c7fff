"""``ckptscope archs``: the architecture tables are generated from the mapping data, never written by hand."""

from __future__ import annotations

import json

from ckptscope.formats.megatron import model_layout as layout
from ckptscope.mappings.schemas import SCHEMAS, Rule
from ckptscope.ops.archs import arch_info, list_archs
from tests.conftest import run_cli


def test_every_arch_and_every_rule_is_listed_as_json():
    result = run_cli("archs", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert [a["name"] for a in doc["archs"]] == list(SCHEMAS)
    for arch in doc["archs"]:
        rules = SCHEMAS[arch["name"]]
        assert [(t["hf"], t["mcore"], t["transform"]) for t in arch["tensors"]] == \
            [(list(r.hf), r.mcore[0], r.transform) for r in rules]


def test_human_view_names_every_arch_and_its_tensors():
    result = run_cli("archs")
    assert result.code == 0, result.err
    for name, rules in SCHEMAS.items():
        assert name in result.out
        for rule in rules:
            assert rule.mcore[0] in result.out and rule.hf[0] in result.out


def test_one_arch_in_detail_shows_aliases_local_names_and_facts():
    result = run_cli("archs", "gemma2")
    assert result.code == 0, result.err
    assert "Gemma2ForCausalLM" in result.out
    assert "also decoder.layers.{i}.pre_mlp_layernorm.weight" in result.out
    assert "zero-centred" in result.out and "sqrt(hidden_size)" in result.out
    assert "[gate_t; up_t]" in result.out  # rich markup must not eat the bracketed text
    assert "mixtral" not in result.out


def test_unknown_arch_is_one_line_and_exit_2():
    result = run_cli("archs", "gpt5")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0 and "known: " in result.err and "gemma2, " in result.err


def test_adding_a_rule_changes_the_listing(monkeypatch):
    before = arch_info("llama")
    extra = Rule(("model.layers.{i}.self_attn.o_proj.bias",), ("decoder.layers.{i}.self_attention.linear_proj.bias",))
    monkeypatch.setitem(SCHEMAS, "llama", SCHEMAS["llama"] + (extra,))
    monkeypatch.setitem(SCHEMAS, "toy", (extra,))
    after = arch_info("llama")
    assert len(after.tensors) == len(before.tensors) + 1
    added = after.tensors[-1]
    assert added.mcore == "decoder.layers.{i}.self_attention.linear_proj.bias"
    assert added.tp == "replicated"  # a row-parallel linear's bias: derived from the split table, not typed here
    assert "toy" in [a.name for a in list_archs()]


def test_parallel_splits_come_from_the_layout_tables():
    """For every rule, the TP split shown is the one the Megatron writers' tables apply, EP marks exactly
    the routed experts, and PP puts the embedding first and the head last."""
    expected = {layout.COLUMN: "column (dim 0)", layout.ROW: "row (dim 1)", layout.REPLICATED: "replicated",
                layout.GLU: "column, [gate_t; up_t] per rank"}
    for info in list_archs():
        for t in info.tensors:
            name = t.mcore.replace("{i}", "0").replace("{e}", "0")
            split = layout.split_layer(name)
            mtp = layout.split_mtp(name)  # MTP layers live on the last stage
            if mtp is not None and not mtp[1].startswith(layout.MTP_LAYER):
                table = layout.MTP_LAYOUT[mtp[1]]
                assert t.pp == "last stage"
            elif mtp is not None:
                sub = mtp[1][len(layout.MTP_LAYER):]
                expert = layout.split_expert(sub)
                table = (layout.EXPERT_LAYOUT[expert[1]] if expert else
                         layout.MOE_LAYER_LAYOUT.get(sub) or layout.LAYER_LAYOUT[sub])
                assert t.pp == "last stage"
            elif split is None:
                table = layout.TOP_LAYOUT[name]
                assert t.pp == ("first stage" if name.startswith("embedding.") else "last stage")
            else:
                sub = layout.canonical_sub(split[1], moe=False)
                expert = layout.split_expert(sub)
                table = (layout.EXPERT_LAYOUT[expert[1]] if expert else
                         layout.MOE_LAYER_LAYOUT.get(sub) or layout.LAYER_LAYOUT[sub])
                assert t.pp == "layer {i}'s stage"
            if table == layout.COLUMN and t.transform == "gate_up":
                table = layout.GLU
            assert t.tp.removeprefix("expert-TP ") == expected[table], (info.name, t.mcore)
            assert t.ep == ("{e}" in t.mcore), (info.name, t.mcore)


def test_moe_archs_name_the_fused_expert_layout_from_their_expert_rules():
    facts = {info.name: " ".join(info.facts) for info in list_archs()}
    assert "[w1; w3]" in facts["mixtral"] and "block_sparse_moe -> mlp" in facts["mixtral"]
    assert "[gate_proj; up_proj]" in facts["qwen3_moe"]
    assert "gate_up_proj" not in facts["llama"] and "gate_up_proj" not in facts["gemma2"]


def test_rules_for_some_layers_only_say_which():
    """Qwen3-MoE's dense layers (mlp_only_layers) name their norm and MLP as a dense model does: the listing
    showed two rules for post_attention_layernorm without saying which layers each is for."""
    result = run_cli("archs", "qwen3_moe")
    assert result.code == 0, result.err
    assert "only in layers with mlp.gate.weight" in result.out
    assert "only in layers without mlp.gate.weight" in result.out
    doc = json.loads(run_cli("archs", "qwen3_moe", "--json").out)
    layers = {t["mcore"]: t["layers"] for t in doc["tensors"]}
    assert layers["decoder.layers.{i}.mlp.linear_fc2.weight"].startswith("layers without")
    assert layers["decoder.layers.{i}.mlp.router.weight"] is None
