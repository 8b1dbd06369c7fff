"""Names for the Adam state of an HF Trainer checkpoint, whose ``optimizer.pt`` has none.

``Trainer._save_checkpoint`` writes ``torch.save(optimizer.state_dict())``: torch numbers the
parameters 0, 1, 2 ... through the param groups in order (``state.<k>.exp_avg_sq``,
``param_groups[g]["params"] = [k, ...]``) and keeps no name. The names come back only by
rebuilding the order the optimizer was built in: the model is rebuilt on the meta device from the
checkpoint's ``config.json`` (transformers, no weights), and the saved groups are matched against

* ``Trainer.create_optimizer``'s grouping: the parameters with weight decay, then those without,
  each in ``model.named_parameters()`` order (transformers' own ``get_decay_parameter_names``
  decides which is which), or
* one group of every parameter in ``named_parameters()`` order (an optimizer handed to the Trainer
  as ``optimizers=(AdamW(model.parameters()), ...)``).

A grouping is accepted only when every group has the saved number of parameters, every
``exp_avg_sq`` has the shape of the parameter at its position and the checkpoint holds that
parameter with that shape; when none (or more than one distinct one) passes, the iteration gets no
Adam statistics and the reason says why. A frozen parameter (``requires_grad=False``) is left out
of the optimizer and shifts every position after it; nothing in the save says which one it was, so
such a save is refused rather than guessed at: statistics under the wrong name are worse than none.

``optimizer.pt`` is read through the safe stub unpickler (``open_checkpoint``), never ``torch.load``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.units import plural
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.registry import open_checkpoint

OPTIMIZER_FILE = "optimizer.pt"
CONFIG_FILE = "config.json"
_STATE_KEY = re.compile(r"^state\.(\d+)\.exp_avg_sq$")


@dataclass
class NamedState:
    """One save's Adam second moments under parameter names."""

    reader: CheckpointReader
    """The optimizer file, open; the stored names below are read through it."""
    stored: dict[str, str]
    """Parameter name -> key of its ``exp_avg_sq`` in ``reader``."""
    eps: float | None
    grouping: str
    """Which optimizer construction the positions matched (for the notes)."""


def param_groups(reader: CheckpointReader) -> list[dict[str, Any]] | None:
    """A saved ``optimizer.state_dict()``'s ``param_groups`` (each with its ``params`` positions),
    or None; shared with ``optim_verl``, whose rank files hold the same structure."""
    for obj in reader.index().objects:
        if obj.name == "param_groups" and isinstance(obj.value, list):
            groups = obj.value
            if all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
                return groups
    return None


@functools.lru_cache(maxsize=8)
def _model_order(config_text: str) -> tuple[str, tuple[tuple[str, tuple[int, ...]], ...], frozenset[str]]:
    """(architecture, ``named_parameters()`` names and shapes, names with weight decay) of the model
    ``config_text`` describes, built on the meta device. Raises ``CkptError`` with the reason."""
    try:
        import torch
        import transformers
    except ImportError:
        raise CkptError("rebuilding the parameter order needs torch and transformers") from None
    import json

    try:
        config_dict = json.loads(config_text)
    except ValueError as exc:
        raise CkptError(f"config.json is not JSON: {exc}") from None
    archs = config_dict.get("architectures") if isinstance(config_dict, dict) else None
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    cls = getattr(transformers, archs[0], None) if archs else None
    if cls is None:
        raise CkptError(f"config.json names no architecture transformers {transformers.__version__} knows "
                        f"({archs[0] if archs else 'none'})")
    try:
        config = transformers.CONFIG_MAPPING[config_dict.get("model_type")].from_dict(config_dict)
        with torch.device("meta"):
            model = cls(config)
        from transformers import Trainer

        decay = frozenset(Trainer.get_decay_parameter_names(None, model))  # does not use self
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party constructor is a reason, not a crash
        raise CkptError(f"cannot rebuild {archs[0]} from config.json: {type(exc).__name__}: {exc}") from None
    order = tuple((n, tuple(p.shape)) for n, p in model.named_parameters())
    return archs[0], order, decay


def _groupings(order, decay) -> dict[str, list[list[str]]]:
    names = [n for n, _shape in order]
    return {
        "Trainer.create_optimizer (weight decay, then none)": [[n for n in names if n in decay],
                                                               [n for n in names if n not in decay]],
        "one group in model order": [names],
    }


def _match(groups: list[dict], candidate: list[list[str]], shapes: dict[str, tuple[int, ...]],
           moments: dict[int, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> tuple[dict[int, str] | None, str]:
    """Position -> name under ``candidate``, or None and why it does not fit."""
    sizes = [len(g["params"]) for g in groups]
    if sizes != [len(c) for c in candidate]:
        return None, f"saved groups of {sizes} parameters, expected {[len(c) for c in candidate]}"
    by_pos: dict[int, str] = {}
    for group, names in zip(groups, candidate):
        for pos, name in zip(group["params"], names):
            if not isinstance(pos, int):
                return None, f"param group position {pos!r} is not a number"
            by_pos[pos] = name
    for pos, shape in moments.items():
        name = by_pos.get(pos)
        if name is None:
            return None, f"state {pos} is in no param group"
        if shapes[name] != shape:
            return None, f"state {pos}'s exp_avg_sq is {list(shape)}, its parameter {name} is {list(shapes[name])}"
        if saved.get(name) != shape:
            return None, f"{name} (state {pos}) is not in the checkpoint with shape {list(shape)}"
    return by_pos, ""


def hf_trainer_state(directory: str | Path, saved: dict[str, tuple[int, ...]]) -> tuple[NamedState | None, str]:
    """The named Adam state of one HF Trainer checkpoint dir, or None and the reason. ``saved``: the
    model tensors the checkpoint holds (name -> shape), as the timeline follows them."""
    directory = Path(directory)
    path = directory / OPTIMIZER_FILE
    if not path.is_file():
        return None, f"no {OPTIMIZER_FILE}"
    try:
        config_text = (directory / CONFIG_FILE).read_text(encoding="utf-8")
    except OSError:
        return None, f"no {CONFIG_FILE} to rebuild the parameter order from"
    try:
        arch, order, decay = _model_order(config_text)
    except CkptError as exc:
        return None, str(exc.args[0])
    reader = None
    try:
        reader = open_checkpoint(path)  # the safe stub unpickler
        reader.index()
    except CkptError as exc:
        if reader is not None:
            reader.close()
        return None, f"{OPTIMIZER_FILE} unreadable: {exc.args[0]}"
    keep = False
    try:
        groups = param_groups(reader)
        if groups is None:
            return None, f"{OPTIMIZER_FILE} has no param_groups with parameter positions"
        moments = {}
        for name, meta in reader.index().tensors.items():
            m = _STATE_KEY.match(name)
            if m:
                moments[int(m.group(1))] = tuple(meta.shape)
        if not moments:
            return None, f"{OPTIMIZER_FILE} holds no exp_avg_sq"
        shapes = dict(order)
        found: dict[tuple, tuple[str, dict[int, str]]] = {}
        why = []
        for label, candidate in _groupings(order, decay).items():
            by_pos, reason = _match(groups, candidate, shapes, moments, saved)
            if by_pos is None:
                why.append(f"{label}: {reason}")
            else:
                found.setdefault(tuple(sorted(by_pos.items())), (label, by_pos))
        if not found:
            return None, (f"cannot tell which parameter each position of {OPTIMIZER_FILE} is ({arch} has "
                          f"{plural(len(order), 'parameter')}; {'; '.join(why)}; frozen parameters or another "
                          "model?)")
        if len(found) > 1:
            return None, f"the positions of {OPTIMIZER_FILE} fit more than one parameter order"
        label, by_pos = next(iter(found.values()))
        eps_values = {g.get("eps") for g in groups}
        eps = eps_values.pop() if len(eps_values) == 1 else None
        stored = {by_pos[pos]: f"state.{pos}.exp_avg_sq" for pos in moments}
        keep = True
        return NamedState(reader, stored, float(eps) if isinstance(eps, (int, float)) else None, label), ""
    finally:
        if not keep:
            reader.close()
