"""A value pager: any slice of a tensor in NumPy syntax, read a page at a time.

The TUI's Values tab types ``[3, :, 100:140]`` into a slice box and scrolls through the result.
Only the page on screen is read (``reader.read`` with a box), so paging through a 10 GB tensor
reads kilobytes. An integer index fixes an axis (a layer of a stacked Megatron tensor, an
expert); the last two free axes are the page's rows and columns, and any further free axis is
pinned at its first index (the page title says so) until the user steps it.

Display is dtype-exact: every value is kept as stored, so a bf16 or fp8 cell can show its stored
bits (``0x3f80``) beside the float it encodes (``1.0``), the number the format really holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ckptscope.core.errors import CkptError

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.formats.base import CheckpointReader

_INT = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis of a selection: ``index`` set fixes it; else the half-open range ``start:stop``."""

    start: int
    stop: int
    index: int | None = None

    @property
    def free(self) -> bool:
        return self.index is None

    def text(self, size: int) -> str:
        if self.index is not None:
            return str(self.index)
        if self.start == 0 and self.stop == size:
            return ":"
        return f"{self.start}:{self.stop}"


@dataclass(frozen=True, slots=True)
class Selection:
    """A parsed slice: one ``Axis`` per dimension of the tensor."""

    shape: tuple[int, ...]
    axes: tuple[Axis, ...]

    def text(self) -> str:
        return "[" + ", ".join(a.text(s) for a, s in zip(self.axes, self.shape)) + "]"

    @property
    def free_axes(self) -> list[int]:
        return [d for d, a in enumerate(self.axes) if a.free]

    def stepped(self, step: int) -> "Selection":
        """The same selection one step further along its first fixed axis (the next layer); with
        no fixed axis, along the first free axis beyond the page's two (pinned at its start)."""
        fixed = [d for d, a in enumerate(self.axes) if not a.free]
        if fixed:
            d = fixed[0]
            new = min(max(0, self.axes[d].index + step), self.shape[d] - 1)  # type: ignore[operator]
            return self._with(d, Axis(new, new + 1, new))
        free = self.free_axes
        if len(free) > 2:  # the held axis becomes an index, so the slice box says exactly what is shown
            d = free[0]
            index = min(max(0, self.axes[d].start + step), self.shape[d] - 1)
            return self._with(d, Axis(index, index + 1, index))
        return self

    @property
    def can_step(self) -> bool:
        """Whether ``]`` / ``[`` move anything: a fixed axis, or a held one beyond the page's two."""
        return any(not a.free for a in self.axes) or len(self.free_axes) > 2

    def _with(self, dim: int, axis: Axis) -> "Selection":
        axes = list(self.axes)
        axes[dim] = axis
        return replace(self, axes=tuple(axes))


def _bound(text: str, size: int, default: int, what: str) -> int:
    text = text.strip()
    if not text:
        return default
    if not _INT.match(text):
        raise CkptError(f"{what} {text!r} is not an integer")
    value = int(text)
    if value < 0:
        value += size
    return min(max(value, 0), size)


def parse_selection(text: str, shape: tuple[int, ...]) -> Selection:
    """``[3, :, 100:140]`` (brackets optional, ``...`` allowed, missing trailing axes whole).

    Integers may be negative (counted from the end, as NumPy does). Steps are refused: a page
    shows contiguous values.
    """
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    items = [p.strip() for p in body.split(",")] if body.strip() else []
    if items and items[-1] == "":
        items.pop()
    if items.count("...") > 1:
        raise CkptError("only one ... in a slice")
    if "..." in items:
        at = items.index("...")
        fill = len(shape) - (len(items) - 1)
        if fill < 0:
            raise CkptError(f"too many indices for a tensor of {len(shape)} dimensions")
        items = items[:at] + [":"] * fill + items[at + 1:]
    if len(items) > len(shape):
        raise CkptError(f"{len(items)} indices for a tensor of {len(shape)} dimensions {list(shape)}")
    items += [":"] * (len(shape) - len(items))
    axes = []
    for dim, (item, size) in enumerate(zip(items, shape)):
        if ":" in item:
            parts = item.split(":")
            if len(parts) > 3 or (len(parts) == 3 and parts[2].strip() not in ("", "1")):
                raise CkptError(f"axis {dim}: steps are not supported ({item!r}); a page shows contiguous values")
            start = _bound(parts[0], size, 0, f"axis {dim}: start")
            stop = _bound(parts[1], size, size, f"axis {dim}: stop")
            if stop <= start:
                raise CkptError(f"axis {dim}: {item!r} selects nothing (size {size})")
            axes.append(Axis(start, stop))
        else:
            if not _INT.match(item):
                raise CkptError(f"axis {dim}: {item!r} is neither an index nor a slice")
            index = int(item)
            if not -size <= index < size:
                raise CkptError(f"axis {dim}: index {index} is out of range for size {size}")
            index %= size
            axes.append(Axis(index, index + 1, index))
    return Selection(tuple(shape), tuple(axes))


@dataclass(frozen=True, slots=True)
class ValuePage:
    """One screenful of a selection: ``values`` is 2-D (rows x columns) as stored."""

    name: str
    dtype: str
    selection: Selection
    row_axis: int | None
    """The tensor axis the rows walk (None: a single row)."""
    col_axis: int | None
    """The tensor axis the columns walk (None: a scalar)."""
    row_start: int
    """Global index along ``row_axis`` of the first row shown."""
    col_start: int
    values: Any
    """numpy array of shape (rows, cols), in the stored dtype (bf16/fp8 via ml_dtypes)."""
    pinned: tuple[int, ...]
    """Free axes beyond the page's two, held at their first index."""

    @property
    def rows_total(self) -> int:
        if self.row_axis is None:
            return 1
        a = self.selection.axes[self.row_axis]
        return a.stop - a.start

    @property
    def cols_total(self) -> int:
        if self.col_axis is None:
            return 1
        a = self.selection.axes[self.col_axis]
        return a.stop - a.start

    def index_of(self, row: int, col: int) -> tuple[int, ...]:
        """The global index of the cell at page position ``(row, col)``."""
        out = []
        for d, a in enumerate(self.selection.axes):
            if d == self.row_axis:
                out.append(self.row_start + row)
            elif d == self.col_axis:
                out.append(self.col_start + col)
            else:
                out.append(a.start)
        return tuple(out)

    def title(self) -> str:
        """``name[3, 0:64, 100:140]`` of what the page shows, with pinned axes named."""
        parts = []
        for d, (a, size) in enumerate(zip(self.selection.axes, self.selection.shape)):
            if d == self.row_axis:
                parts.append(f"{self.row_start}:{self.row_start + self.values.shape[0]}")
            elif d == self.col_axis:
                parts.append(f"{self.col_start}:{self.col_start + self.values.shape[1]}")
            else:
                parts.append(str(a.start))
        text = f"{self.name}[{', '.join(parts)}]"
        if self.pinned:
            text += f"  (axis {', '.join(map(str, self.pinned))} held at its first index: [ ] step)"
        return text


def page_axes(selection: Selection) -> tuple[int | None, int | None, tuple[int, ...]]:
    """(row axis, column axis, pinned axes) of a selection: the last two free axes are shown."""
    free = selection.free_axes
    if not free:
        return None, None, ()
    if len(free) == 1:
        return None, free[0], ()
    return free[-2], free[-1], tuple(free[:-2])


def read_page(reader: "CheckpointReader", name: str, selection: Selection, *, row: int = 0, col: int = 0,
              rows: int = 64, cols: int = 16) -> ValuePage:
    """Read the page of ``selection`` that starts ``row`` rows and ``col`` columns into it.

    Reads at most ``rows`` x ``cols`` values. Offsets past the end are clamped to the last page.
    """
    meta = reader.meta(name)
    row_axis, col_axis, pinned = page_axes(selection)
    box = []
    row_start = col_start = 0
    for d, a in enumerate(selection.axes):
        if d == row_axis:
            row_start = a.start + max(0, min(row, a.stop - a.start - 1))
            box.append(slice(row_start, min(a.stop, row_start + max(1, rows))))
        elif d == col_axis:
            col_start = a.start + max(0, min(col, a.stop - a.start - 1))
            box.append(slice(col_start, min(a.stop, col_start + max(1, cols))))
        else:
            box.append(slice(a.start, a.start + 1))
    array = reader.read(name, tuple(box)) if box else reader.read(name)
    n_rows = box[row_axis].stop - box[row_axis].start if row_axis is not None else 1
    n_cols = box[col_axis].stop - box[col_axis].start if col_axis is not None else 1
    values = array.reshape(n_rows, n_cols)
    return ValuePage(name, meta.dtype, selection, row_axis, col_axis, row_start, col_start, values, pinned)


def stored_bits(value: Any) -> str | None:
    """The stored bits of one numpy scalar as hex (``0x3f80`` for bf16 1.0); None for non-floats."""
    import numpy as np

    dtype = np.asarray(value).dtype
    if dtype.kind not in "fV" and "float" not in dtype.name:
        return None
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(dtype.itemsize)
    if width is None:
        return None
    bits = int(np.asarray(value).reshape(1).view(width)[0])
    return f"0x{bits:0{dtype.itemsize * 2}x}"


def exact_float(value: Any) -> str:
    """The number a stored value encodes, exactly: every bf16/fp8/f16/f32 value is a float64, and
    ``repr`` of a float64 is its shortest round-trip spelling."""
    import numpy as np

    kind = np.asarray(value).dtype.kind
    if kind == "b":
        return str(bool(value))
    if kind in "iu":
        return str(int(value))
    return repr(float(value))
