"""The supported architectures, as ``ckptscope archs`` lists them (palette: "view: supported
architectures"). The data is ``ops.archs``, generated from the mapping tables convert and diff use,
so this page cannot drift from what the tools do: each architecture's tensors, HF name <-> Megatron-Core
name, the transform, and how TP, EP and PP split it, plus the model-level facts a conversion carries.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, OptionList, Static

from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys


class ArchTable(SearchableTable, DataTable[object]):
    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("archs"), *search_bindings("archs")]
    search_what = "tensors"


class ArchList(OptionList):
    """The architecture names, with j/k as in every list."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "down", show=False, id="archlist.down", tooltip="Next architecture"),
        Binding("k", "cursor_up", "up", show=False, id="archlist.up", tooltip="Previous architecture"),
    ]


class ArchsScreen(ModalScreen[None]):
    """Architectures on the left, the highlighted one's tensors on the right."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss(None)", "close", id="archs.close", tooltip="Close the architectures page"),
        Binding("tab", "focus_next", "switch pane", show=False, id="archs.next"),
    ]
    DEFAULT_CSS = """
    ArchsScreen { align: center middle; }
    #archs-box { width: 96%; height: 94%; border: round $accent; background: $panel; padding: 0 1; }
    #archs-list { width: 22; height: 1fr; }
    #archs-table { width: 1fr; height: 1fr; }
    #archs-facts { height: auto; max-height: 6; }
    """

    def compose(self) -> ComposeResult:
        from ckptscope.ops.archs import list_archs

        self.archs = {info.name: info for info in list_archs()}
        with Vertical(id="archs-box"):
            yield Static(Text.assemble(("Supported architectures", "bold"),
                                       ("   from the mapping tables convert and diff use (ckptscope archs)", "dim")))
            with Horizontal():
                yield ArchList(*self.archs, id="archs-list")
                yield ArchTable(id="archs-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="archs-facts")
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(ArchTable)
        table.add_columns("HF", "Megatron-Core", "transform", "TP", "EP", "PP")
        self.show(next(iter(self.archs)))
        self.query_one(OptionList).focus()

    def show(self, name: str) -> None:
        info = self.archs[name]
        table = self.query_one(ArchTable)
        table.clear()
        for t in info.tensors:
            mcore = Text(t.mcore)
            if t.layers:
                mcore.append(f"\nonly in {t.layers}", style="dim")
            table.add_row(Text("\n".join(t.hf)), mcore, t.transform, t.tp, "yes" if t.ep else "-", t.pp,
                          height=max(1, len(t.hf), 2 if t.layers else 1))
        facts = Text.assemble((f"{info.name}", "bold magenta"), f"  {info.hf_class}  model_type "
                              f"{', '.join(info.model_types) or '-'}  ·  {len(info.tensors)} rules")
        for fact in info.facts:
            facts.append(f"\n· {fact}", style="dim")
        self.query_one("#archs-facts", Static).update(facts)

    @on(OptionList.OptionHighlighted, "#archs-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.show(str(event.option.prompt))
