"""The TUI side of rename, without widgets: what the cursor selects, the pending rule list, and
how a preview compares two reports.

Which name ends up where is decided only by ``ops.rename.plan.check_name_changes`` (through
``ops.rename.rules``); this module never applies a rule itself. It only chooses what to show:
the rows a new rule changes, the conflicts among them, and per-module counts for the tree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Literal

from ckptscope.ops.rename.plan import NameChanges, NameReport
from ckptscope.ops.rename.rules import RenameRule, check_rules, copies_pattern
from ckptscope.ops.tree import TreeNode

MAX_COPIES = 1024
"""Copies of a node inside nested ranges expanded for display; more are summarised."""


@dataclass(frozen=True, slots=True)
class Selection:
    """The tensor or module under the cursor, with every copy it stands for inside layer ranges."""

    kind: Literal["tensor", "subtree"]
    path: str
    """Stored name (tensor) or dotted prefix (subtree) of the first copy."""
    ranges: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """(segment index, member keys) of each enclosing range, outermost first."""
    display: str = ""
    """The path with ranges shown as ``[0-3]``."""

    @property
    def copies(self) -> int:
        count = 1
        for _, keys in self.ranges:
            count *= len(keys)
        return count

    def paths(self, limit: int = MAX_COPIES) -> list[str]:
        """The stored name or prefix of every copy (at most ``limit``)."""
        if not self.ranges:
            return [self.path]
        segments = self.path.split(".")
        out = []
        for keys in product(*(k for _, k in self.ranges)):
            for (position, _), key in zip(self.ranges, keys):
                segments[position] = key
            out.append(".".join(segments))
            if len(out) >= limit:
                break
        return out

    def regex(self, path: str | None = None) -> tuple[str, str]:
        """Pattern and replacement that match every copy (see ``copies_pattern``); ``path`` is the
        first copy's current name when pending rules renamed it."""
        return copies_pattern(path or self.path, self.ranges, prefix=self.kind == "subtree")


def selection_of(chain: Sequence[TreeNode], *, tensor: bool) -> Selection:
    """Selection for the last node of ``chain`` (the displayed ancestors, root excluded)."""
    node = chain[-1]
    ranges = []
    display = node.path.split(".")
    for ancestor in chain:
        if ancestor.is_range:
            position = ancestor.path.count(".")
            keys = tuple(m.rpartition(".")[2] for m in ancestor.members)
            ranges.append((position, keys))
            display[position] = ancestor.label
    return Selection("tensor" if tensor else "subtree", node.path, tuple(ranges), ".".join(display))


class PendingRenames:
    """The rules added so far for one checkpoint, and the report of applying all of them.

    The report is recomputed on demand (``report``) and cached per version of the rule list,
    so the tree, the header and the dialogs all read the same one.
    """

    def __init__(self, path: str, names: Sequence[str],
                 checker: Callable[[NameChanges], str | None] | None = None) -> None:
        self.path = path
        self.names = list(names)
        self._checker = checker
        """What applying would refuse beyond the names (``ops.rename.engine.changes_checker``)."""
        self.rules: list[RenameRule] = []
        self.version = 0
        self._report: tuple[int, NameReport] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.rules)

    def add(self, rule: RenameRule) -> None:
        self.rules.append(rule)
        self.version += 1

    def undo(self) -> RenameRule | None:
        if not self.rules:
            return None
        self.version += 1
        return self.rules.pop()

    def remove(self, position: int) -> RenameRule:
        self.version += 1
        return self.rules.pop(position)

    def report(self) -> NameReport:
        """Report for the current rules (every name untouched when there are none)."""
        with self._lock:
            version, rules = self.version, list(self.rules)
            if self._report is not None and self._report[0] == version:
                return self._report[1]
        report = check_rules(self.names, rules)  # the rules were each checked when added: no regex errors
        with self._lock:
            if version == self.version:
                self._report = (version, report)
        return report

    def apply_problem(self, report: NameReport) -> str | None:
        """Why applying ``report``'s changes would be refused although its names are fine (a torch
        file's tensor moved out of its dict); may read the checkpoint's files once: call off the UI thread."""
        return self._checker(report.changes) if self._checker is not None else None

    def with_rule(self, rule: RenameRule) -> NameReport:
        """Report if ``rule`` were added (raises ``RenamePlanError`` for an invalid regex)."""
        return check_rules(self.names, [*self.rules, rule])

    def current_name(self, original: str) -> str | None:
        """Name ``original`` has after the pending rules (None when dropped)."""
        return self.report().changes.new_name(original) if self.rules else original

    def current_prefix(self, prefix: str) -> str:
        """The module's prefix after the pending rules, when they moved it as a whole; else ``prefix``.

        (``model.*`` renamed to ``backbone.*`` earlier: a new rule on ``model.layers`` must match
        ``backbone.layers``, since substitutions apply to the names the earlier ones produced.)
        """
        if not self.rules:
            return prefix
        changes = self.report().changes
        start = prefix + "."
        found: str | None = None
        for name in self.names:
            if not name.startswith(start):
                continue
            new = changes.new_name(name)
            if new is None:
                continue
            tail = name[len(start):]
            if not new.endswith("." + tail):
                return prefix
            head = new[: -len(tail) - 1]
            if found is None:
                found = head
            elif head != found:
                return prefix
        return found or prefix


    def current_path(self, selection: Selection) -> str:
        """The selection's (first copy's) name or prefix after the pending rules.

        A new rule must match that name, since substitutions apply in order. When the pending rules
        changed the copies' own indices or the number of segments, the stored path is returned and
        the preview shows what the rule still matches.
        """
        first = selection.path
        current = self.current_name(first) if selection.kind == "tensor" else self.current_prefix(first)
        if current is None or current == first:
            return first
        old, new = first.split("."), current.split(".")
        if selection.ranges and (len(old) != len(new) or any(old[p] != new[p] for p, _ in selection.ranges)):
            return first
        return current


@dataclass(frozen=True, slots=True)
class PreviewRow:
    old: str
    new: str | None
    """None: dropped."""
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Preview:
    rows: list[PreviewRow] = field(default_factory=list)
    changed: int = 0
    """Tensors whose name this rule changes (or that it drops)."""
    conflicts: int = 0
    total: int = 0
    """Rows there are (``rows`` holds the first ones)."""
    error: str = ""
    """The error ``plan_rename`` would raise with this rule added (empty when it is fine)."""


def preview(names: Sequence[str], base: NameReport, candidate: NameReport, limit: int = 400) -> Preview:
    """Rows for every name ``candidate`` treats differently from ``base``, plus every name in a
    conflict with one of them (an existing name it collides with, a second tensor mapped to the
    same new name), each conflict with its reason. Conflicts come first, grouped by the name they
    fight over, so the rows of one conflict sit together."""
    before, after = base.changes, candidate.changes
    affected = [n for n in names if before.new_name(n) != after.new_name(n)]
    touched = set(affected)
    problems: dict[str, str] = {}
    for new, olds in candidate.clashes.items():
        if not touched.intersection(olds):
            continue
        for old in olds:
            others = [o for o in olds if o != old]
            if old == new:
                problems[old] = f"existing name, {others[0]} would take it" if len(others) == 1 else \
                    f"existing name, {len(others)} others would take it"
            elif new in olds:
                problems[old] = "collides with the existing name"
            else:
                problems[old] = f"same new name as {others[0]}" if len(others) == 1 else \
                    f"same new name as {len(others)} others"
    for old in candidate.empty:
        if old in touched:
            problems[old] = "empty name"
    shown = list(problems)  # clash groups in order, then empty names
    shown += [n for n in affected if n not in problems]
    rows = [PreviewRow(old, after.new_name(old), problems.get(old, "")) for old in shown[:limit]]
    error = candidate.error()
    return Preview(rows, len(affected), len(problems), len(shown), str(error) if error is not None else "")


def change_counts(changes: NameChanges) -> dict[str, int]:
    """Renamed or dropped tensors under every dotted prefix (for "3 pending" on tree modules)."""
    counts: dict[str, int] = {}
    for name in (*changes.renamed, *changes.dropped):
        end = name.find(".")
        while end != -1:
            prefix = name[:end]
            counts[prefix] = counts.get(prefix, 0) + 1
            end = name.find(".", end + 1)
    return counts


@dataclass(frozen=True, slots=True)
class PendingView:
    """What the tree shows for pending renames: each stored name's new name, counts per module."""

    changes: NameChanges
    counts: dict[str, int]

    @classmethod
    def of(cls, changes: NameChanges) -> PendingView:
        return cls(changes, change_counts(changes))

    def new_name(self, name: str) -> str | None:
        return self.changes.new_name(name)

    def count(self, prefixes: Iterable[str]) -> int:
        return sum(self.counts.get(p, 0) for p in prefixes)


def default_destination(src: str | Path) -> Path:
    """``<src>-renamed`` next to the source or its save root (``x-renamed.safetensors`` for a file),
    the first that does not exist yet (``-renamed-2``, ...)."""
    from ckptscope.tui.destinations import default_destination as beside

    return beside(src, "renamed", keep_suffix=True)
