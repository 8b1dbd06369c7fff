"""Rename rules as the TUI builds them: the same checks as the CLI, regexes that match exactly
what was selected, and the preview's conflict rows. Expected names are computed here with plain
string operations, not with the code under test."""

from __future__ import annotations

import re

import pytest

from ckptscope.ops.rename.plan import RenamePlanError, check_name_changes, compute_name_changes
from ckptscope.ops.rename.rules import (
    check_rules,
    copies_pattern,
    drop_name,
    drop_prefix,
    regex_rule,
    rename_name,
    rename_prefix,
    rule_hits,
    rules_request,
)
from ckptscope.tui.renaming import PendingRenames, PendingView, Selection, default_destination, preview

NAMES = [
    "lm_head.weight",
    "model.embed_tokens.weight",
    *[f"model.layers.{i}.{part}.weight" for i in range(12) for part in ("attn.q", "attn.k", "mlp.up")],
    "model.norm.weight",
]


@pytest.mark.parametrize("kwargs", [
    {"subs": [(r"layers\.\d+\.", "layers.X.")]},
    {"subs": [(r"^model\.norm\.weight$", "lm_head.weight")]},
    {"subs": [(r".*", "")]},
    {"subs": [("nothing_here", "x")], "drops": ["^nope$"]},
    {"mapping": {"no.such": "x"}},
    {"subs": [(r"^model\.", "backbone.")], "drops": [r"\.mlp\."]},
])
def test_report_error_is_what_compute_raises(kwargs):
    report = check_name_changes(NAMES, **kwargs)
    error = report.error()
    if error is None:
        assert compute_name_changes(NAMES, **kwargs) == report.changes
    else:
        with pytest.raises(RenamePlanError) as raised:
            compute_name_changes(NAMES, **kwargs)
        assert str(raised.value) == str(error)


def test_report_lists_every_clash_and_collision_with_untouched():
    report = check_name_changes(NAMES, subs=[(r"^model\.norm\.weight$", "lm_head.weight"),
                                             (r"attn\.[qk]", "attn.qk")])
    assert report.clashes["lm_head.weight"] == ("lm_head.weight", "model.norm.weight")
    for i in range(12):
        assert report.clashes[f"model.layers.{i}.attn.qk.weight"] == (f"model.layers.{i}.attn.q.weight",
                                                                       f"model.layers.{i}.attn.k.weight")
    assert len(report.clashes) == 13


def test_builders_escape_pattern_and_replacement():
    names = ["a.b[0].w", "a.b0.w", r"x\1"]
    rule = rename_name("a.b[0].w", r"c.\1.w")
    changes = check_rules(names, [rule]).changes
    assert changes.renamed == {"a.b[0].w": r"c.\1.w"}
    assert check_rules(names, [rename_prefix("a", "")]).changes.renamed == {"a.b[0].w": "b[0].w", "a.b0.w": "b0.w"}
    assert check_rules(names, [drop_name(r"x\1")]).changes.dropped == (r"x\1",)
    assert check_rules(names, [drop_prefix("a.b[0]")]).changes.dropped == ("a.b[0].w",)
    assert rules_request([rule, drop_name("q"), regex_rule("a", "b")]) == (
        [(rule.pattern, rule.repl), ("a", "b")], [drop_name("q").pattern])


def test_copies_pattern_matches_exactly_the_range_members():
    members = ["3", "4", "5", "6"]
    pattern, repl = copies_pattern("model.layers.3.attn.q.weight", [(2, members)], prefix=False)
    matched = [n for n in NAMES if re.search(pattern, n)]
    assert matched == [f"model.layers.{i}.attn.q.weight" for i in range(3, 7)]
    # the replacement keeps each copy's index
    assert [re.sub(pattern, repl.replace("attn.q", "self_attn.q_proj"), n) for n in matched] == [
        f"model.layers.{i}.self_attn.q_proj.weight" for i in range(3, 7)]
    pattern, repl = copies_pattern("model.layers.3", [(2, members)], prefix=True)
    assert [n for n in NAMES if re.search(pattern, n)] == [n for n in NAMES if n.split(".")[2:3] and
                                                           n.startswith("model.layers.") and
                                                           n.split(".")[2] in members]
    assert re.sub(pattern, "blocks.\\g<1>.", "model.layers.5.mlp.up.weight") == "blocks.5.mlp.up.weight"


def test_selection_paths_over_nested_ranges():
    sel = Selection("tensor", "m.layers.0.experts.2.w", ((2, ("0", "1")), (4, ("2", "3", "4"))), "")
    assert sel.copies == 6
    assert sel.paths() == [f"m.layers.{i}.experts.{j}.w" for i in "01" for j in "234"]


def test_rule_hits_follow_rule_order():
    rules = [rename_prefix("model", "backbone"), drop_name("lm_head.weight"), rename_name("backbone.norm.weight", "n")]
    hits = rule_hits(check_rules(NAMES, rules), rules)
    assert hits == [len(NAMES) - 1, 1, 1]


def test_pending_current_names_follow_earlier_rules():
    pending = PendingRenames("x", NAMES)
    pending.add(rename_prefix("model", "backbone"))
    assert pending.current_name("model.norm.weight") == "backbone.norm.weight"
    assert pending.current_prefix("model.layers") == "backbone.layers"
    sel = Selection("subtree", "model.layers.0", ((2, tuple(str(i) for i in range(12))),), "model.layers.[0-11]")
    assert pending.current_path(sel) == "backbone.layers.0"
    pending.add(drop_name("lm_head.weight"))
    assert pending.current_name("lm_head.weight") is None
    view = PendingView.of(pending.report().changes)
    assert view.count(["model"]) == len(NAMES) - 1
    assert view.count(["model.layers.1", "model.layers.2"]) == 6
    assert pending.undo() == drop_name("lm_head.weight") and len(pending) == 1


def test_preview_rows_and_conflict_reasons():
    pending = PendingRenames("x", NAMES)
    base = pending.report()
    rows = preview(NAMES, base, pending.with_rule(rename_name("model.norm.weight", "lm_head.weight"))).rows
    assert {(r.old, r.new, r.problem) for r in rows} == {
        ("model.norm.weight", "lm_head.weight", "collides with the existing name"),
        ("lm_head.weight", "lm_head.weight", "existing name, model.norm.weight would take it"),
    }
    result = preview(NAMES, base, pending.with_rule(regex_rule(r"attn\.[qk]", "attn.qk")))
    assert result.changed == 24 and result.conflicts == 24 and "names would collide" in result.error
    result = preview(NAMES, base, pending.with_rule(regex_rule(r"^model\.embed_tokens\.weight$", "")))
    assert result.rows[0].problem == "empty name" and "empty name" in result.error
    result = preview(NAMES, base, pending.with_rule(regex_rule(r"\.mlp\.", ".ffn.")))
    assert result.changed == 12 and not result.conflicts and not result.error


def test_default_destination_is_a_free_sibling(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    assert default_destination(folder) == tmp_path / "ckpt-renamed"
    (tmp_path / "ckpt-renamed").mkdir()
    assert default_destination(folder) == tmp_path / "ckpt-renamed-2"
    single = tmp_path / "model.safetensors"
    single.write_bytes(b"")
    assert default_destination(single) == tmp_path / "model-renamed.safetensors"
