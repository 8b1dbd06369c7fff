"""Inside a collapsed range: pick one layer to open, or two to compare (``p`` on a range row).

``layers.[0-31] ×32`` hides 32 identical-looking layers behind one row; this is how a user gets
to layer 7 itself (its tensors, values and stats) or sees how far layer 3 is from layer 17. The
pick dialog only parses the answer; the browse screen opens the layer, and compares in a worker
(``ops.layers.compare_members``) whose result this module's table screen shows.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from ckptscope.core.units import shape_str
from ckptscope.ops.layers import LayerPair
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys


def parse_pick(text: str, keys: list[str]) -> tuple[str, ...] | str:
    """``7`` -> ("7",); ``3 17`` or ``3,17`` -> ("3", "17"); anything else -> an error message."""
    parts = text.replace(",", " ").split()
    if not 1 <= len(parts) <= 2:
        return "type one layer to open it, or two to compare them"
    for part in parts:
        if part not in keys:
            return f"{part} is not a layer of this range ({keys[0]}-{keys[-1]})"
    if len(parts) == 2 and parts[0] == parts[1]:
        return "type two different layers to compare"
    return tuple(parts)


class LayerPickScreen(ModalScreen[tuple[str, ...] | None]):
    """Asks which layer(s) of a range; dismisses with their keys, or None on esc."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "cancel", id="layers.cancel")]
    DEFAULT_CSS = """
    LayerPickScreen { align: center middle; }
    #pick-box { width: 64; max-width: 96%; height: auto; border: round $accent; padding: 0 1; background: $panel; }
    #pick-error { color: $error; height: auto; }
    """

    def __init__(self, label: str, keys: list[str]) -> None:
        super().__init__()
        self.label, self.keys = label, keys

    def compose(self) -> ComposeResult:
        with Vertical(id="pick-box"):
            yield Static(Text.assemble(("Layers of ", "bold"), (self.label, "bold magenta")))
            yield Static(Text(f"one layer ({self.keys[0]}-{self.keys[-1]}) opens it; two, e.g. "
                              f"{self.keys[0]} {self.keys[-1]}, compare them", style="dim"))
            yield Input(placeholder=f"{self.keys[0]}", id="pick-input")
            yield Static("", id="pick-error")

    @on(Input.Submitted, "#pick-input")
    def _submitted(self, event: Input.Submitted) -> None:
        answer = parse_pick(event.value, self.keys)
        if isinstance(answer, str):
            self.query_one("#pick-error", Static).update(answer)
        else:
            self.dismiss(answer)


def _number(value: object, fmt: str = ".4g") -> str:
    return "-" if value is None else format(value, fmt) if isinstance(value, float) else str(value)


class CompareTable(SearchableTable, DataTable[object]):
    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("layers"), *search_bindings("layers")]
    search_what = "tensors"


class LayerCompareScreen(ModalScreen[None]):
    """Per-tensor metrics of layer ``a`` against layer ``b`` of one range."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss(None)", "close", id="layers.close"),
    ]
    DEFAULT_CSS = """
    LayerCompareScreen { align: center middle; }
    #compare-box { width: 120; max-width: 98%; height: auto; max-height: 90%; border: round $accent;
                   padding: 0 1; background: $panel; }
    #compare-table { height: auto; max-height: 30; }
    """

    def __init__(self, label: str, a: str, b: str, pairs: list[LayerPair]) -> None:
        super().__init__()
        self.label, self.a, self.b, self.pairs = label, a, b, pairs

    def compose(self) -> ComposeResult:
        same = sum(1 for p in self.pairs if p.metrics["num_diff"] == 0)
        with Vertical(id="compare-box"):
            yield Static(Text.assemble(("Layer ", "bold"), (self.a, "bold magenta"), (" against layer ", "bold"),
                                       (self.b, "bold magenta"), (f"  of {self.label}", "dim")))
            yield Static(Text(f"{len(self.pairs)} tensors, {same} identical"
                              + ("  (identical layers: a copy, or an untrained init?)" if same == len(self.pairs)
                                 and self.pairs else ""), style="yellow" if same else "dim"))
            yield CompareTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("tensor", "shape", "dtype", "differ", "max |a-b|", "rel L2", "cosine")
        for pair in self.pairs:
            m = pair.metrics
            table.add_row(pair.suffix, shape_str(pair.shape), pair.dtype, _number(m["num_diff"]),
                          _number(m["max_abs_diff"]), _number(m["rel_l2"]), _number(m["cosine"], ".6f"))
        table.focus()
