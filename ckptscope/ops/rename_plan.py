"""Which tensor gets which new name: computed and checked before anything is written.

Order of application, per stored name: ``--drop`` patterns (regex search) remove a tensor;
otherwise an exact ``--map`` entry renames it; otherwise every ``--sub`` is applied in order
(``re.sub``). Mistakes are errors, never silent: a pattern or map key that matches nothing,
two names that end up the same (or collide with an untouched name), or an empty name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ckptscope.core.errors import CkptError

_SHOW = 5


class RenamePlanError(CkptError):
    """The requested renames are inconsistent; the message lists the offending names."""


@dataclass(frozen=True, slots=True)
class NameChanges:
    renamed: dict[str, str] = field(default_factory=dict)
    """old -> new, only names that change."""
    dropped: tuple[str, ...] = ()
    untouched: tuple[str, ...] = ()

    def new_name(self, old: str) -> str | None:
        """The name ``old`` will have, or None when it is dropped."""
        if old in self.dropped:
            return None
        return self.renamed.get(old, old)


def _listing(items: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in items[:_SHOW])
    return shown + (f" and {len(items) - _SHOW} more" if len(items) > _SHOW else "")


def compile_patterns(patterns: Iterable[str], what: str) -> list[re.Pattern[str]]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise RenamePlanError(f"{what} pattern {pattern!r} is not a valid regex: {exc}") from None
    return compiled


def compute_name_changes(names: Sequence[str], *, subs: Sequence[tuple[str, str]] = (), drops: Sequence[str] = (),
                         mapping: Mapping[str, str] | None = None) -> NameChanges:
    """Apply drops, the explicit map and the substitutions to ``names`` and validate the result."""
    mapping = dict(mapping or {})
    drop_res = compile_patterns(drops, "--drop")
    sub_res = [(rx, repl) for rx, (_, repl) in zip(compile_patterns([p for p, _ in subs], "--sub"), subs)]
    drop_hits = [0] * len(drop_res)
    sub_hits = [0] * len(sub_res)

    unknown_keys = [k for k in mapping if k not in set(names)]
    if unknown_keys:
        raise RenamePlanError(f"--map names tensors that do not exist: {_listing(unknown_keys)}")

    renamed: dict[str, str] = {}
    dropped: list[str] = []
    untouched: list[str] = []
    for name in names:
        hit = [i for i, rx in enumerate(drop_res) if rx.search(name)]
        if hit:
            for i in hit:
                drop_hits[i] += 1
            dropped.append(name)
            continue
        new = mapping.get(name, name)
        if name not in mapping:
            for i, (rx, repl) in enumerate(sub_res):
                try:
                    replaced, count = rx.subn(repl, new)
                except (re.error, IndexError) as exc:
                    raise RenamePlanError(f"--sub replacement {repl!r} is invalid: {exc}") from None
                if count:
                    sub_hits[i] += 1
                    new = replaced
        if new != name:
            renamed[name] = new
        else:
            untouched.append(name)

    unmatched = [f"--drop {drops[i]!r}" for i, n in enumerate(drop_hits) if not n]
    unmatched += [f"--sub {subs[i][0]!r}" for i, n in enumerate(sub_hits) if not n]
    if unmatched:
        raise RenamePlanError(f"pattern matches no tensor: {', '.join(unmatched)}")

    empty = [old for old, new in renamed.items() if not new.strip()]
    if empty:
        raise RenamePlanError(f"renaming would leave an empty name for: {_listing(empty)}")

    owners: dict[str, list[str]] = {}
    for old in untouched:
        owners.setdefault(old, []).append(old)
    for old, new in renamed.items():
        owners.setdefault(new, []).append(old)
    clashes = [f"{', '.join(repr(o) for o in olds)} -> {new!r}" for new, olds in owners.items() if len(olds) > 1]
    if clashes:
        more = f" and {len(clashes) - _SHOW} more" if len(clashes) > _SHOW else ""
        raise RenamePlanError(f"names would collide: {'; '.join(clashes[:_SHOW])}{more}")
    return NameChanges(renamed=renamed, dropped=tuple(dropped), untouched=tuple(untouched))
