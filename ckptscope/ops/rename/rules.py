"""Rename rules built one at a time (the TUI's pending list), turned into one ``plan_rename`` request.

A rule is either a regex substitution or a drop, exactly what ``ckptscope rename --sub`` /
``--drop`` take, so the TUI and the CLI run one code path: the pending list becomes
``subs``/``drops`` and goes through ``check_name_changes`` (preview) and ``plan_rename`` (apply).
Substitutions apply in order, each to the name the ones before produced; drops match the stored
(original) names.

The builders here write the regex for the common cases (one name, a module prefix, the copies of
a repeated layer), escaping both the pattern and the replacement.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ckptscope.ops.rename.plan import NameReport, check_name_changes

RuleKind = Literal["sub", "drop"]


@dataclass(frozen=True, slots=True)
class RenameRule:
    kind: RuleKind
    pattern: str
    repl: str = ""
    label: str = ""
    """What the user asked for, in words (``model.norm.weight → final_norm.weight``)."""

    def as_cli(self) -> str:
        """The same rule as a ``ckptscope rename`` option (shell-quoted)."""
        import shlex

        if self.kind == "drop":
            return f"--drop {shlex.quote(self.pattern)}"
        return f"--sub {shlex.quote(self.pattern)} {shlex.quote(self.repl)}"


def escape_repl(text: str) -> str:
    """``text`` as a literal ``re.sub`` replacement (backslashes would start group references)."""
    return text.replace("\\", "\\\\")


def rename_name(old: str, new: str) -> RenameRule:
    """Rename exactly one (current) name."""
    return RenameRule("sub", f"^{re.escape(old)}$", escape_repl(new), f"{old} → {new}")


def rename_prefix(old: str, new: str) -> RenameRule:
    """Rename a module: every name ``old.*`` becomes ``new.*`` (an empty ``new`` strips the prefix)."""
    return RenameRule("sub", f"^{re.escape(old)}\\.", escape_repl(new) + "." if new else "",
                      f"{old}.* → {new + '.' if new else ''}*")


def regex_rule(pattern: str, repl: str) -> RenameRule:
    return RenameRule("sub", pattern, repl, f"s/{pattern}/{repl}/")


def drop_names(pattern: str, label: str) -> RenameRule:
    return RenameRule("drop", pattern, "", label)


def drop_name(name: str) -> RenameRule:
    return drop_names(f"^{re.escape(name)}$", f"drop {name}")


def drop_prefix(prefix: str) -> RenameRule:
    return drop_names(f"^{re.escape(prefix)}\\.", f"drop {prefix}.*")


def copies_pattern(path: str, ranges: Sequence[tuple[int, Sequence[str]]], *, prefix: bool) -> tuple[str, str]:
    """Regex and replacement matching every copy of ``path`` inside repeated layers.

    ``ranges`` are (dotted segment index, member keys) of each enclosing range: for
    ``model.layers.0.mlp.w`` inside ``layers.[0-3]`` that is ``[(2, ["0", "1", "2", "3"])]``, giving
    ``^model\\.layers\\.(0|1|2|3)\\.mlp\\.w$`` -> ``model.layers.\\g<1>.mlp.w``: the replacement
    keeps each copy's own index, so editing it renames all copies alike.
    """
    segments = path.split(".")
    pattern_parts = [re.escape(s) for s in segments]
    repl_parts = [escape_repl(s) for s in segments]
    for group, (position, keys) in enumerate(sorted(ranges), start=1):
        pattern_parts[position] = "(" + "|".join(re.escape(k) for k in keys) + ")"
        repl_parts[position] = f"\\g<{group}>"
    pattern = "^" + "\\.".join(pattern_parts) + ("\\." if prefix else "$")
    return pattern, ".".join(repl_parts) + ("." if prefix else "")


def rules_request(rules: Sequence[RenameRule]) -> tuple[list[tuple[str, str]], list[str]]:
    """``(subs, drops)`` for ``plan_rename`` / ``check_name_changes``, in the order added."""
    subs = [(r.pattern, r.repl) for r in rules if r.kind == "sub"]
    drops = [r.pattern for r in rules if r.kind == "drop"]
    return subs, drops


def check_rules(names: Sequence[str], rules: Sequence[RenameRule]) -> NameReport:
    """The report for ``rules`` on ``names`` (raises ``RenamePlanError`` for an invalid regex)."""
    subs, drops = rules_request(rules)
    return check_name_changes(names, subs=subs, drops=drops)


def rule_hits(report: NameReport, rules: Sequence[RenameRule]) -> list[int]:
    """How many tensors each rule changed (substitutions) or removed (drops), in rule order."""
    subs, drops = iter(report.sub_hits), iter(report.drop_hits)
    return [next(drops) if r.kind == "drop" else next(subs) for r in rules]
