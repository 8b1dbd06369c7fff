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
from ckptscope.formats.blockscaled import PAIR_SUFFIXES

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


@dataclass(frozen=True, slots=True)
class NameReport:
    """Everything ``compute_name_changes`` checks, collected instead of raised.

    The TUI previews a rule while it is typed and highlights each offending name; the CLI raises
    the first problem. Both read this one report, so the rules cannot drift apart.
    """

    changes: NameChanges
    subs: tuple[tuple[str, str], ...] = ()
    drops: tuple[str, ...] = ()
    sub_hits: tuple[int, ...] = ()
    """Tensors each ``--sub`` changed, in the order given."""
    drop_hits: tuple[int, ...] = ()
    """Tensors each ``--drop`` removed."""
    unknown_keys: tuple[str, ...] = ()
    """``--map`` keys that name no tensor."""
    empty: tuple[str, ...] = ()
    """Old names whose new name would be empty."""
    clashes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """new name -> every old name that would end up with it (two or more; an untouched name
    collides with itself: it is listed as its own old name)."""
    split_scales: tuple[tuple[str, str], ...] = ()
    """(payload, scale) pairs of block-scaled weights the changes would part (``split_scale_pairs``)."""

    @property
    def unmatched_subs(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.sub_hits) if not n)

    @property
    def unmatched_drops(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.drop_hits) if not n)

    @property
    def ok(self) -> bool:
        return self.error() is None

    def error(self) -> RenamePlanError | None:
        """The error ``compute_name_changes`` raises for this report (the first problem), or None."""
        if self.unknown_keys:
            return RenamePlanError(f"--map names tensors that do not exist: {_listing(self.unknown_keys)}")
        unmatched = [f"--drop {self.drops[i]!r}" for i in self.unmatched_drops]
        unmatched += [f"--sub {self.subs[i][0]!r}" for i in self.unmatched_subs]
        if unmatched:
            return RenamePlanError(f"pattern matches no tensor: {', '.join(unmatched)}")
        if self.empty:
            return RenamePlanError(f"renaming would leave an empty name for: {_listing(self.empty)}")
        if self.clashes:
            shown = [f"{', '.join(repr(o) for o in olds)} -> {new!r}" for new, olds in self.clashes.items()]
            more = f" and {len(shown) - _SHOW} more" if len(shown) > _SHOW else ""
            return RenamePlanError(f"names would collide: {'; '.join(shown[:_SHOW])}{more}")
        if self.split_scales:
            payload, scale = self.split_scales[0]
            more = f" (and {len(self.split_scales) - 1} more)" if len(self.split_scales) > 1 else ""
            return RenamePlanError(f"{scale!r} holds the block scales of {payload!r}: rename or drop them together "
                                   f"(the scale's name must stay the weight's name + "
                                   f"{'_scale_inv' if scale.endswith('_scale_inv') else '_scales for _blocks'}){more}")
        return None


def _scale_pairs(names: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """(payload, scale, payload suffix, scale suffix) of every block-scaled weight among ``names``."""
    if "_scale" not in "\0".join(names):
        return []
    known = set(names)
    pairs = []
    for scale in names:
        for scale_suffix, payload_suffix in PAIR_SUFFIXES:
            if scale.endswith(scale_suffix) and (payload := scale[: -len(scale_suffix)] + payload_suffix) in known:
                pairs.append((payload, scale, payload_suffix, scale_suffix))
    return pairs


def _carry_scales(names: Sequence[str], renamed: dict[str, str], dropped: list[str], untouched: list[str]) -> None:
    """A rule that renames or drops a block-scaled weight carries its scales along when it leaves them
    untouched (``X.weight`` -> ``Y.weight`` takes ``X.weight_scale_inv`` to ``Y.weight_scale_inv``): the
    TUI renames the one logical tensor it shows, and a ``--sub`` on ``\\.weight$`` means the weight with
    its scales. A scale the rules changed themselves is left as they say (``split_scale_pairs`` judges it)."""
    pairs = _scale_pairs(names)
    if not pairs:
        return
    gone, still = set(dropped), set(untouched)
    for payload, scale, payload_suffix, scale_suffix in pairs:
        if scale not in still:
            continue
        if payload in gone:
            dropped.append(scale)
        elif payload in renamed and renamed[payload].endswith(payload_suffix):
            new = renamed[payload]
            renamed[scale] = new[: len(new) - len(payload_suffix)] + scale_suffix
        else:
            continue
        still.discard(scale)
    untouched[:] = [n for n in untouched if n in still]


def split_scale_pairs(names: Sequence[str], changes: NameChanges) -> tuple[tuple[str, str], ...]:
    """(payload, scale) pairs that ``changes`` would part: one dropped and not the other, or renamed
    so the scale's name no longer follows its payload's. Parted, the weight would read as its raw
    quantised codes (FP8 without its scale) and the scale as a stray tensor."""
    split = []
    for payload, scale, payload_suffix, scale_suffix in _scale_pairs(names):
        new_payload, new_scale = changes.new_name(payload), changes.new_name(scale)
        if new_payload is None or new_scale is None:
            parted = (new_payload is None) != (new_scale is None)
        else:
            parted = not (new_payload.endswith(payload_suffix) and
                          new_scale == new_payload[: len(new_payload) - len(payload_suffix)] + scale_suffix)
        if parted:
            split.append((payload, scale))
    return tuple(split)


def check_name_changes(names: Sequence[str], *, subs: Sequence[tuple[str, str]] = (), drops: Sequence[str] = (),
                       mapping: Mapping[str, str] | None = None) -> NameReport:
    """Apply drops, the explicit map and the substitutions to ``names``; report every problem.

    Raises ``RenamePlanError`` only for a pattern or replacement that is not a valid regex (there
    is no result to report then).
    """
    mapping = dict(mapping or {})
    drop_res = compile_patterns(drops, "--drop")
    sub_res = [(rx, repl) for rx, (_, repl) in zip(compile_patterns([p for p, _ in subs], "--sub"), subs)]
    drop_hits = [0] * len(drop_res)
    sub_hits = [0] * len(sub_res)
    known = set(names)
    unknown_keys = tuple(k for k in mapping if k not in known)

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

    if renamed or dropped:
        _carry_scales(names, renamed, dropped, untouched)
    empty = tuple(old for old, new in renamed.items() if not new.strip())
    owners: dict[str, list[str]] = {}
    for old in untouched:
        owners.setdefault(old, []).append(old)
    for old, new in renamed.items():
        owners.setdefault(new, []).append(old)
    clashes = {new: tuple(olds) for new, olds in owners.items() if len(olds) > 1}
    changes = NameChanges(renamed=renamed, dropped=tuple(dropped), untouched=tuple(untouched))
    return NameReport(changes=changes,
                      subs=tuple((p, r) for p, r in subs), drops=tuple(drops), sub_hits=tuple(sub_hits),
                      drop_hits=tuple(drop_hits), unknown_keys=unknown_keys, empty=empty, clashes=clashes,
                      split_scales=split_scale_pairs(names, changes) if renamed or dropped else ())


def compute_name_changes(names: Sequence[str], *, subs: Sequence[tuple[str, str]] = (), drops: Sequence[str] = (),
                         mapping: Mapping[str, str] | None = None) -> NameChanges:
    """Apply drops, the explicit map and the substitutions to ``names`` and validate the result."""
    report = check_name_changes(names, subs=subs, drops=drops, mapping=mapping)
    error = report.error()
    if error is not None:
        raise error
    return report.changes
