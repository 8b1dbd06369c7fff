"""Fitting a name, or a row built around one, into the cells a widget has, so that a cut shows.

Textual's ``Tree`` crops a row at the widget's edge with no mark, and ``Text(overflow="ellipsis")``
does not help there (the tree renders the label without wrapping or overflow). A row cut that way
looked whole (``embedding.word_embeddings.weig``). Here a row knows its parts: the details after
the name (shape, size, parameter count) go first, whole, and leave a ``…``; only then is the name
itself cut, keeping its end (``…word_embeddings.weight``) as the diff table does, because the end
tells ``q_proj.weight`` from ``k_proj.weight``.
"""

from __future__ import annotations

from rich.text import Text

from ckptscope.core.units import middle_ellipsis

TAIL_ONLY_BELOW = 30
"""Narrower than this, a cut name keeps only its end (``…attn.k_proj.weight``)."""
MORE = ("  …", " …")
"""What stands for the details a row had no room for (the second where the first does not fit)."""
MIN_NAME = 6
"""A name cut shorter than this says nothing; the row is then cut at its end instead."""


def shorten(name: str, width: int) -> str:
    """The whole name when it fits; else its start and end around a middle ellipsis, the end given
    more room (it tells ``q_proj.weight`` from ``k_proj.weight``); in a narrow cell only the end."""
    return middle_ellipsis(name, width, head=0.4 if width >= TAIL_ONLY_BELOW else 0.0)


class Row(Text):
    """A one-line label that knows where its name is and where each detail after it starts.

    Build it with ``append_name`` (once) and ``start_detail`` (before each detail), then ``fit``.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.name_span: tuple[int, int] = (0, 0)
        self.name_style = ""
        self.details: list[int] = []
        """Offsets where each droppable detail starts, in order (the last one is dropped first)."""

    def append_name(self, name: str, style: str = "") -> None:
        start = len(self)
        self.append(name, style=style)
        self.name_span, self.name_style = (start, len(self)), style

    def start_detail(self) -> None:
        self.details.append(len(self))

    def fit(self, width: int) -> Text:
        """This row in ``width`` cells: whole when it fits; else without its last details (a dim
        ``…`` in their place); else with its name cut in the middle; never cut without a ``…``."""
        if width <= 0 or self.cell_len <= width:
            return self
        for start in reversed(self.details):
            head = self[:start]
            for more in MORE:
                if head.cell_len + len(more) <= width:
                    head.append(more, style="dim")
                    return head
        core = self[: self.details[0]] if self.details else self[:]
        start, end = self.name_span
        room = width - (core.cell_len - (end - start))
        if end > start and room >= MIN_NAME:
            name = self.plain[start:end]
            core = Text.assemble(core[:start], Text(shorten(name, room), style=self.name_style), core[end:])
        if core.cell_len > width:
            core.truncate(width, overflow="ellipsis")
        return core
