"""Rich rendering of ``inspect`` for humans: a summary table and the collapsed module tree."""

from __future__ import annotations

from collections import Counter

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ckptscope.core.units import human_bytes, human_count, plural, shape_str
from ckptscope.ops.inspect import InspectReport
from ckptscope.ops.tree import TreeNode

DTYPE_STYLES = {
    "float32": "cyan", "float64": "blue", "bfloat16": "green", "float16": "yellow",
    "int64": "magenta", "int32": "magenta", "uint8": "red", "bool": "red",
}


MAX_CHILDREN = 40
"""Children printed per module before "… N more": a tree that does not collapse (distinct names in
every layer) would otherwise print one line per tensor, 100,000 lines that take rich seconds to
lay out and nobody reads (``--include`` narrows, ``--json`` lists everything)."""


def dtype_style(dtype: str) -> str:
    if dtype.startswith("float8"):
        return "bright_red"
    return DTYPE_STYLES.get(dtype, "white")


def print_inspect(report: InspectReport, *, collapse: bool = True, console: Console | None = None,
                  max_children: int | None = MAX_CHILDREN) -> None:
    if console is None:
        from ckptscope.cli.console import stdout_console

        console = stdout_console()
    console.print(summary_table(report))
    if report.index.tensors:
        print_tree(console, render_tree(report, collapse=collapse, max_children=max_children))
    training = report.training_tree(collapse=collapse)
    if training is not None:
        print_tree(console, _render_node(training, "training state (not part of the model)", unit="elements",
                                         max_children=max_children))
    if report.index.objects:
        console.print(objects_table(report))


class _NotPlain(Exception):
    """A tree ``print_tree`` leaves to rich: a label that wraps, or holds tabs or control characters."""


def print_tree(console: Console, tree: Tree) -> None:
    """``console.print(tree)``, written straight to the console's file when the output is plain text.

    Piped (``inspect > file``, bench row 3) rich emits no styles, and laying out thousands of tree rows
    through its segment pipeline was a third of the command's time for 100,000 tensors (issue 15). The
    lines are the ones rich draws (its default ``├── ``/``│   `` guides, no padding); any row that would
    wrap, any tab or control character, or a console that styles, records or is ASCII-only goes to rich.
    """
    if console.color_system is not None or console.record or console.options.ascii_only or console.legacy_windows:
        console.print(tree)
        return
    width = console.width
    lines: list[str] = []

    def add(label: object, prefix: str) -> None:
        if not isinstance(label, Text):
            raise _NotPlain
        text = label.plain
        if not text.isprintable() or cell_len(prefix) + cell_len(text) > width:
            raise _NotPlain
        lines.append(prefix + text)

    def walk(node: Tree, indent: str) -> None:
        children = node.children
        for i, child in enumerate(children, 1):
            last = i == len(children)
            if not child.expanded or child.guide_style != "tree.line":
                raise _NotPlain
            add(child.label, indent + ("└── " if last else "├── "))
            walk(child, indent + ("    " if last else "│   "))

    try:
        if tree.hide_root or tree.guide_style != "tree.line":
            raise _NotPlain
        add(tree.label, "")
        walk(tree, "")
    except _NotPlain:
        console.print(tree)
        return
    console.file.write("\n".join(lines) + "\n")


def summary_table(report: InspectReport) -> Table:
    index = report.index
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("path", index.path)
    fmt = index.format + (f" ({index.metadata['weights']})" if "weights" in index.metadata else "")
    table.add_row("format", fmt)
    if index.iteration is not None:
        table.add_row("iteration", str(index.iteration))
    roles = Counter(f.role for f in index.files)
    total = sum(f.size for f in index.files)
    table.add_row("files", f"{len(index.files)} ({', '.join(f'{n} {r}' for r, n in roles.items())}), {human_bytes(total)}")
    shown = f"{len(index)}" if len(index) == report.total_tensors else f"{len(index)} of {report.total_tensors} (filtered)"
    table.add_row("tensors", shown)
    entries = report.entries
    model_params = entries.num_params
    naming = "" if entries.naming == "other" else f", {entries.naming} names"
    under = f" under {entries.prefix!r}" if entries.prefix else ""
    table.add_row("parameters", f"{human_count(model_params)} ({model_params:,}) in the model{under}{naming}")
    if entries.training:
        parts = [f"{kind} {human_bytes(sum(m.nbytes for m in group.values()))} ({len(group)})"
                 for kind, group in entries.training.items()]
        table.add_row("training state", ", ".join(parts) + "  (not counted as parameters)")
    if entries.unknown:
        table.add_row(Text("unknown", style="bold yellow"),
                      Text(f"{plural(len(entries.unknown), 'tensor')} neither model nor training state "
                           f"(first: {next(iter(entries.unknown))}); never exported", style="yellow"))
    per_dtype = Text()
    total_bytes = index.total_bytes or 1
    for i, (dtype, nbytes) in enumerate(index.bytes_per_dtype().items()):
        if i:
            per_dtype.append("  ")
        per_dtype.append(dtype, style=dtype_style(dtype))
        per_dtype.append(f" {human_bytes(nbytes)} ({100 * nbytes / total_bytes:.0f}%)")
    table.add_row("bytes", per_dtype if len(per_dtype) else "0 B")
    for key in ("architectures", "model_type"):
        if key in index.metadata:
            value = index.metadata[key]
            table.add_row(key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
    gguf = index.metadata.get("gguf")
    for name, info in (gguf.get("tensor_types", {}) if isinstance(gguf, dict) else {}).items():
        table.add_row(f"ggml {name}", f"{plural(info['tensors'], 'tensor')}, {human_bytes(info['bytes'])} stored; "
                                      f"{info['block']}")
    for warning in index.warnings:
        table.add_row(Text("warning", style="bold yellow"), Text(warning, style="yellow"))
    return table


def _node_label(node: TreeNode, label: str, unit: str = "params") -> Text:
    text = Text()
    if node.tensor is not None and not node.children:
        meta = node.tensor
        text.append(label, style="bold")
        if node.is_range:
            text.append(f"  ×{node.repeat}", style="bold magenta")
        text.append("  ")
        text.append(meta.dtype, style=dtype_style(meta.dtype))
        text.append(f" {shape_str(meta.shape)}", style="dim")
        text.append(f"  {human_count(node.num_params)}  {human_bytes(node.nbytes)}", style="dim")
        if (ggml := meta.attr("ggml_type")) is not None and meta.attr("stored_bytes") is not None:
            text.append(f"  {ggml} ({human_bytes(int(meta.attr('stored_bytes') or 0))} stored)", style="magenta")
        if len(meta.chunks) > 1:
            text.append(f"  {len(meta.chunks)} chunks", style="dim")
        quant = meta.quantization
        if quant:
            stored = (f"{quant['payload_dtype']} {meta.attr('quant_block')} blocks" if quant["scheme"] == "fp8_block"
                      else f"mxfp4, {meta.attr('quant_block')} per e8m0 scale")
            text.append(f"  = {stored} + {str(quant['scale']).rsplit('.', 1)[-1]}", style="yellow")
        return text
    text.append(label, style="bold blue")
    if node.is_range:
        text.append(f"  ×{node.repeat}", style="bold magenta")
    text.append(f"  {human_count(node.num_params)} {unit}  {human_bytes(node.nbytes)}", style="dim")
    return text


def render_tree(report: InspectReport, *, collapse: bool = True, max_children: int | None = MAX_CHILDREN) -> Tree:
    """The model's module tree (training state has its own, see ``print_inspect``)."""
    return _render_node(report.tree(collapse=collapse), "model", max_children=max_children)


def _render_node(node: TreeNode, title: str, unit: str = "params", max_children: int | None = MAX_CHILDREN) -> Tree:
    root = Tree(Text.assemble((title, "bold"), (f"  {human_count(node.num_params)} {unit}  {human_bytes(node.nbytes)}",
                                                "dim")))
    _add_children(root, node, max_children, unit)
    return root


def _add_children(branch: Tree, node: TreeNode, max_children: int | None, unit: str = "params") -> None:
    children = node.folded_children()
    shown = children if max_children is None else children[:max_children]
    for label, target in shown:
        _add_children(branch.add(_node_label(target, label, unit)), target, max_children, unit)
    if len(shown) < len(children):
        rest = len(children) - len(shown)
        branch.add(Text(f"… {rest:,} more (--include NAME narrows, --all-children prints them, --json lists every "
                        f"tensor)", style="italic dim"))


def objects_table(report: InspectReport) -> Table:
    table = Table(title="objects", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("name", style="bold")
    table.add_column("type", style="cyan")
    table.add_column("value")
    for entry in report.index.objects:
        table.add_row(entry.name, entry.type, _preview(entry.value))
    return table


def _preview(value: object, limit: int = 80) -> str:
    if isinstance(value, dict):
        keys = [k for k in value if k != "__class__"]
        text = f"{{{plural(len(keys), 'key')}: {', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''}}}"
    elif isinstance(value, list):
        text = f"[{plural(len(value), 'item')}]"
    else:
        text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"
