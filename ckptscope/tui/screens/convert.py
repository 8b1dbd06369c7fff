"""``C`` / "ops: convert / merge…": a form (target, tp, pp, format, dtype, destination) with a live
plan, then the write, then "open result" and a round-trip verify.

The plan is ``ops.convert.plan.plan_convert`` and the write ``ops.convert.execute.execute_convert``: the
calls ``ckptscope convert`` makes. Each runs in a thread worker that posts past-tense messages
(``ConvertPlanned``, ``ConvertProgressed``, ``ConvertFinished``, ``ConvertFailed``,
``ConvertVerified``). Every field change re-plans after a short pause; an older plan that arrives
late is dropped (a token per edit). A ``CkptError`` is shown in the form as one line, never as a
traceback, and nothing is written before "Convert" is pressed on a plan that is shown.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.console import Group
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Checkbox, DataTable, Input, Label, ProgressBar, Select, Static
from textual.worker import Worker, WorkerState, get_current_worker

from ckptscope.core.errors import CkptError
from ckptscope.core.units import human_bytes, rate_eta
from ckptscope.tui.converting import (
    DTYPES,
    FORMATS,
    ConvertSettings,
    plan_detail,
    plan_row,
    plan_summary,
    result_path,
    verify_text,
)
from ckptscope.tui.destinations import default_destination, replaced_text
from ckptscope.tui.messages import (
    ConvertFailed,
    ConvertFinished,
    ConvertPlanned,
    ConvertProgressed,
    ConvertVerified,
)
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.path_suggester import PathSuggester

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.convert.plan import ConvertPlan

PLAN_DELAY = 0.15
"""Seconds of editing pause before the plan is recomputed (it re-reads the source's metadata)."""
PROGRESS_EVERY = 0.05
"""Seconds between progress messages (the writer reports per tensor, far more often on big models)."""
PLAN_ROWS = 2000
"""Rows put in the plan table (it draws only what is visible); more are counted in a last row."""
HINTS = {"editing": "the plan follows the fields · enter in a field moves to Convert",
         "writing": "writing to a temp dir next to the destination; renamed into place when complete",
         "done": "written · the verify uses the same target, tp, pp and format"}


NARROW = 110
SHORT = 36
"""Screens narrower or shorter than this get the compact wrapping form (app.tcss ``.-narrow``)."""


class ConvertScreen(ModalScreen[str | None]):
    """Dismisses with the written checkpoint to browse ("open result"), or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "close", id="convert.close", tooltip="Close the form (not while writing)"),
        Binding("ctrl+s", "convert", "convert", id="convert.run",
                tooltip="Write the converted checkpoint as planned (to a temp dir, renamed into place)"),
        Binding("ctrl+r", "verify", "verify", id="convert.verify",
                tooltip="Convert the source to the target and back in a temp dir, then compare bit for bit"),
        Binding("ctrl+o", "open_result", "open result", id="convert.open",
                tooltip="Browse the converted checkpoint (once written)"),
    ]

    def __init__(self, src: str, *, target: str = "hf", merge: bool = False, about: str = "",
                 trust_pickle: bool = False) -> None:
        super().__init__()
        self.src = src
        self.merge = merge
        self._write_started = 0.0
        self.about = about
        self.trust_pickle = trust_pickle
        self.initial_target = target
        self.stage = "editing"
        """editing -> writing -> done (back to editing when the write fails)."""
        self.plan: ConvertPlan | None = None
        self.problem = ""
        """Why the plan shown cannot be written (the destination exists, ...); '' when it can."""
        self.planning = False
        self.verifying = False
        self.written: str | None = None
        """What "open result" browses: the HF dir, or the iteration dir of the written save root."""
        self.verified = None
        """The last ``DiffReport`` of a verify (tests read it)."""
        self._token = 0
        self._timer: Timer | None = None
        self._default_dst = default_destination(src, target)
        self._auto_dst = True
        """The destination is still the default: a new target renames it (``-hf`` <-> ``-mcore``)."""
        self._verify_dtype = "keep"

    # --- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        from ckptscope.ops.archs import arch_names  # the mapping tables, only once the form opens

        title = "Merge into one HF checkpoint" if self.merge else "Convert"
        promise = "   nothing is written before you press Convert; the source is only read"
        with Vertical(id="convert-box"):
            yield Static(Text.assemble((title, "bold"), (promise, "dim")), id="convert-title")
            yield Static(Text.assemble(("source".ljust(12), "dim"), (self.src, "bold"),
                                       (f"   {self.about}" if self.about else "", "cyan")), id="convert-src")
            with Horizontal(id="convert-fields"):
                yield Label("target", classes="convert-label")
                yield Select([("hf (safetensors)", "hf"), ("mcore (Megatron-Core)", "mcore")],
                             value=self.initial_target, allow_blank=False, id="convert-target")
                yield Label("tp", classes="convert-label-short")
                yield Input("1", type="integer", id="convert-tp", classes="convert-number")
                yield Label("pp", classes="convert-label-short")
                yield Input("1", type="integer", id="convert-pp", classes="convert-number")
                yield Label("format", classes="convert-label-short")
                yield Select([(f, f) for f in FORMATS], value="torch_dist", allow_blank=False, id="convert-format")
                yield Label("dtype", classes="convert-label-short")
                yield Select([(d, d) for d in DTYPES], value="keep", allow_blank=False, id="convert-dtype")
            with Horizontal(id="convert-fields-more"):
                yield Label("hf config", classes="convert-label")
                yield Input("", placeholder="dir with config.json (default: the source's)", id="convert-hf-config",
                            suggester=PathSuggester(),
                            tooltip="--hf-config: the HF config.json to use when the source has none, or to "
                                    "override it (true vocabulary size, architecture)")
                yield Label("ep", classes="convert-label-short")
                yield Input("1", type="integer", id="convert-ep", classes="convert-number",
                            tooltip="--ep: expert parallel size (MoE, format torch)")
                yield Label("spec", classes="convert-label-short")
                yield Select([("local", "local"), ("te", "te")], value="local", allow_blank=False, id="convert-spec",
                             tooltip="--spec: name the Megatron output for the local or Transformer Engine layers")
            with Horizontal(id="convert-fields-arch"):
                yield Label("arch", classes="convert-label")
                yield Select([("detected", "auto"), *((name, name) for name in arch_names())], value="auto",
                             allow_blank=False, id="convert-arch",
                             tooltip="--arch: the architecture when the checkpoint does not say which")
                yield Label("experts", classes="convert-label-short")
                yield Select([("per-expert", "per-expert"), ("fused", "fused")], value="per-expert", allow_blank=False,
                             id="convert-experts",
                             tooltip="--hf-experts: MoE experts in the HF output per expert (save_pretrained) or "
                                     "fused 3-D (transformers v5)")
                yield Label("shard", classes="convert-label-short")
                yield Input("5GB", id="convert-shard", classes="convert-size",
                            tooltip="--max-shard-size: the largest HF safetensors shard (5GB, 500MB, bytes)")
            yield Static(Text("iteration: the one open in the browser (i there picks another); the source is "
                              "only read", style="dim"), id="convert-iteration")
            with Horizontal(id="convert-dst-row"):
                yield Label("destination", classes="convert-label")
                yield Input(str(self._default_dst), id="convert-dst", suggester=PathSuggester())
                with Horizontal(id="convert-dst-flags"):  # under the path when narrow: the path keeps the width
                    yield Checkbox("overwrite", id="convert-overwrite")
                    yield Checkbox("skip unknown", id="convert-skip-unknown",
                                   tooltip="Leave out entries that are neither model weights nor known training state "
                                           "(--skip-unknown); without it they stop the conversion")
                    yield Checkbox("merge LoRA", id="convert-merge-lora",
                                   tooltip="A LoRA training save: merge the adapter into the weights (--merge-lora) "
                                           "instead of writing it apart as lora_adapter/, as verl's merger does")
            yield Static(Text("planning…", style="italic"), id="convert-status")
            yield ProgressBar(id="convert-progress", show_eta=True)
            yield DataTable(id="convert-plan", cursor_type="row")
            yield Static("", id="convert-detail")
            with VerticalScroll(id="convert-verify-box"):
                yield Static("", id="convert-verify")
            with Horizontal(id="convert-buttons"):
                yield Static(Text(HINTS["editing"], style="dim"), id="convert-hint")
                yield Button("Convert", variant="primary", id="convert-go", disabled=True)
                yield Button("Open result", variant="success", id="convert-open")
                yield Button("Verify round trip", id="convert-verify-go")
                yield Button("Cancel", id="convert-cancel")
        yield KeyFooter()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """Narrow or short terminals get one-line fields in wrapping rows (80x24 shows the whole
        form and a few plan rows); wide ones the bordered fields side by side."""
        narrow = self.size.width < NARROW or self.size.height < SHORT
        self.set_class(narrow, "-narrow")
        for widget in self.query("Input, Select, Checkbox, Button"):
            widget.compact = narrow  # type: ignore[attr-defined]

    def on_mount(self) -> None:
        self._fit()
        table = self.query_one("#convert-plan", DataTable)
        table.add_columns("destination tensor", "shape", "dtype", "transforms", "sources")
        self.query_one("#convert-open").display = False
        self.query_one("#convert-verify-box").display = False
        self.query_one("#convert-merge-lora").display = False  # shown once a plan has an adapter to merge
        self._target_changed(self.initial_target)
        self.query_one("#convert-target", Select).focus()
        self._schedule_plan(delay=0)

    def on_unmount(self) -> None:
        if self.plan is not None:
            self.plan.reader.close()

    # --- fields ------------------------------------------------------------------------------

    def settings(self) -> ConvertSettings:
        """The fields as ``plan_convert`` arguments; ``CkptError`` for a tp/pp that is not a number."""
        target = str(self.query_one("#convert-target", Select).value)
        numbers = []
        for name in ("tp", "pp", "ep"):
            text = self.query_one(f"#convert-{name}", Input).value.strip()
            if not text.isdigit() or int(text) < 1:
                raise CkptError(f"{name} must be a whole number of at least 1")
            numbers.append(int(text) if target == "mcore" else 1)
        hf_config = self.query_one("#convert-hf-config", Input).value.strip()
        arch = str(self.query_one("#convert-arch", Select).value)
        shard = self.query_one("#convert-shard", Input).value.strip() or "5GB"
        return ConvertSettings(target, numbers[0], numbers[1], str(self.query_one("#convert-format", Select).value),
                               str(self.query_one("#convert-dtype", Select).value),
                               self.query_one("#convert-skip-unknown", Checkbox).value,
                               ep=numbers[2], spec=str(self.query_one("#convert-spec", Select).value),
                               hf_config=str(Path(hf_config).expanduser()) if hf_config else None,
                               arch=None if arch == "auto" else arch, max_shard_size=shard,
                               hf_experts=str(self.query_one("#convert-experts", Select).value),
                               merge_lora=target == "hf" and self.query_one("#convert-merge-lora", Checkbox).value)

    def destination(self) -> str:
        return str(Path(self.query_one("#convert-dst", Input).value.strip()).expanduser())

    def _target_changed(self, target: str) -> None:
        """tp, pp and format only mean something for Megatron-Core; a default destination follows the target."""
        for field in ("#convert-tp", "#convert-pp", "#convert-format", "#convert-ep", "#convert-spec"):
            self.query_one(field).disabled = target != "mcore" or self.stage != "editing"
        for field in ("#convert-experts", "#convert-shard"):
            self.query_one(field).disabled = target != "hf" or self.stage != "editing"
        if self.stage != "editing":
            return
        if self._auto_dst:
            self._default_dst = default_destination(self.src, target)
            self.query_one("#convert-dst", Input).value = str(self._default_dst)

    @on(Select.Changed, "#convert-target")
    def _target_selected(self, event: Select.Changed) -> None:
        self._target_changed(str(event.value))
        self._schedule_plan()

    @on(Select.Changed, "#convert-format")
    @on(Select.Changed, "#convert-dtype")
    @on(Input.Changed, "#convert-tp")
    @on(Input.Changed, "#convert-pp")
    @on(Input.Changed, "#convert-ep")
    @on(Input.Changed, "#convert-hf-config")
    @on(Select.Changed, "#convert-spec")
    @on(Select.Changed, "#convert-arch")
    @on(Select.Changed, "#convert-experts")
    @on(Input.Changed, "#convert-shard")
    @on(Checkbox.Changed, "#convert-overwrite")
    @on(Checkbox.Changed, "#convert-skip-unknown")
    @on(Checkbox.Changed, "#convert-merge-lora")
    def _field_changed(self) -> None:
        self._schedule_plan()

    @on(Input.Changed, "#convert-dst")
    def _dst_changed(self, event: Input.Changed) -> None:
        self._auto_dst = event.value.strip() == str(self._default_dst)
        self._schedule_plan()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        go = self.query_one("#convert-go", Button)
        if not go.disabled:
            go.focus()

    # --- planning ----------------------------------------------------------------------------

    def _schedule_plan(self, delay: float = PLAN_DELAY) -> None:
        if self.stage != "editing":
            return
        self._token += 1
        token = self._token
        self.planning = True
        self.query_one("#convert-go", Button).disabled = True
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(delay, lambda: self._start_plan(token)) if delay else None
        if not delay:
            self._start_plan(token)

    def _start_plan(self, token: int) -> None:
        if token != self._token or self.stage != "editing":
            return
        try:
            settings = self.settings()
        except CkptError as exc:
            self._show_plan_error(str(exc))
            return
        dst = self.destination()
        if not self.query_one("#convert-dst", Input).value.strip():
            self._show_plan_error("type a destination path")
            return
        self._status(Text.assemble(("planning ", "italic"), (settings.label(), "italic cyan"), ("…", "italic")))
        self._plan(token, settings, dst, self.query_one("#convert-overwrite", Checkbox).value)

    @work(thread=True, exclusive=True, group="convert-plan", exit_on_error=False, description="planning the conversion")
    def _plan(self, token: int, settings: ConvertSettings, dst: str, overwrite: bool) -> None:
        from ckptscope.ops.atomic import check_destination
        from ckptscope.ops.convert.plan import plan_convert

        try:
            plan = plan_convert(self.src, dst, to=settings.target, tp=settings.tp, pp=settings.pp, ep=settings.ep,
                                spec=settings.spec, ckpt_format=settings.ckpt_format, dtype=settings.dtype,
                                hf_config=settings.hf_config, trust_pickle=self.trust_pickle,
                                skip_unknown=settings.skip_unknown, arch=settings.arch,
                                max_shard_size=settings.max_shard_size, hf_experts=settings.hf_experts,
                                merge_lora=settings.merge_lora)
        except CkptError as exc:
            self.post_message(ConvertFailed("plan", str(exc), token))
            return
        if get_current_worker().is_cancelled:
            plan.reader.close()
            return
        problem = ""
        target = Path(dst)
        if (target.exists() or target.is_symlink()) and not overwrite:
            problem = f"{dst}: destination exists (tick “overwrite” to replace it, or change the path)"
        else:
            try:
                check_destination(Path(self.src), target, overwrite=overwrite)
            except CkptError as exc:
                problem = str(exc)
        self.post_message(ConvertPlanned(token, plan, problem))

    @on(ConvertPlanned)
    def _planned(self, message: ConvertPlanned) -> None:
        if message.token != self._token or self.stage != "editing":
            message.plan.reader.close()  # an answer to an older edit
            return
        self._set_plan(message.plan)
        self.planning = False
        self.problem = message.problem
        plan = message.plan
        self.query_one("#convert-merge-lora").display = plan.adapter is not None
        summary = plan_summary(plan)
        if message.problem:
            self._status(Group(Text.assemble(("✗ ", "bold red"), (message.problem, "red")), summary))
        else:
            replaced = replaced_text(plan.dst, self.query_one("#convert-overwrite", Checkbox).value)
            self._status(Group(summary, Text.assemble("into ", (plan.dst, "bold"),
                                                      ("   ctrl+s or Convert writes it", "dim")),
                               *([Text(f"⚠ {replaced}", style="bold yellow")] if replaced else [])))
        self.query_one("#convert-go", Button).disabled = bool(message.problem)
        self._fill_table(plan)

    def _show_plan_error(self, reason: str) -> None:
        self.planning = False
        self.problem = reason
        self._set_plan(None)
        self._status(Group(Text("✗ cannot plan the conversion", style="bold red"), Text(reason, style="red")))
        self.query_one("#convert-go", Button).disabled = True
        self.query_one("#convert-plan", DataTable).clear()
        self.query_one("#convert-detail", Static).update("")

    def _set_plan(self, plan: ConvertPlan | None) -> None:
        if self.plan is not None and self.plan is not plan:
            self.plan.reader.close()
        self.plan = plan

    def _fill_table(self, plan: ConvertPlan) -> None:
        table = self.query_one("#convert-plan", DataTable)
        row = table.cursor_row
        table.clear()
        table.add_rows(plan_row(t) for t in plan.tensors[:PLAN_ROWS])
        if len(plan.tensors) > PLAN_ROWS:
            table.add_row(Text(f"… {len(plan.tensors) - PLAN_ROWS:,} more tensors (the first {PLAN_ROWS:,} "
                               f"are listed; convert --dry-run prints all)", style="dim"), "", "", "", "")
        if plan.tensors:
            table.move_cursor(row=min(row, table.row_count - 1))
            self._show_detail(table.cursor_row)

    @on(DataTable.RowHighlighted, "#convert-plan")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def _show_detail(self, row: int) -> None:
        detail = self.query_one("#convert-detail", Static)
        if self.plan is None or not 0 <= row < min(len(self.plan.tensors), PLAN_ROWS):
            detail.update("")
            return
        detail.update(plan_detail(self.plan.tensors[row]))

    def _status(self, text: Text | Group) -> None:
        self.query_one("#convert-status", Static).update(text)

    # --- writing -----------------------------------------------------------------------------

    def action_convert(self) -> None:
        if self.stage == "done":
            self.notify("Already written: open the result, or close the form to convert again.",
                        severity="information")
            return
        if self.stage != "editing":
            return
        if self.plan is None or self.planning or self.problem:
            reason = "the plan is still being computed" if self.planning else (self.problem or "no plan")
            self.notify(f"Cannot convert yet: {reason}.", severity="warning")
            return
        plan = self.plan
        self._set_stage("writing")
        self.query_one(ProgressBar).update(total=max(1, plan.total_bytes), progress=0)
        self._write_started = time.monotonic()
        self._status(Text.assemble("writing ", (plan.dst, "bold"), f" ({len(plan.tensors):,} tensors, "
                                   f"{human_bytes(plan.total_bytes)})…"))
        self._write(plan, self.query_one("#convert-overwrite", Checkbox).value)

    @work(thread=True, exclusive=True, group="convert-write", exit_on_error=False, description="writing the conversion")
    def _write(self, plan: ConvertPlan, overwrite: bool) -> None:
        from ckptscope.ops.convert.execute import execute_convert

        start = time.perf_counter()
        total, tensors_total = max(1, plan.total_bytes), len(plan.tensors)
        state = {"bytes": 0, "tensors": 0, "last": 0.0}

        def progress(name: str, nbytes: int) -> None:
            state["bytes"] += nbytes
            state["tensors"] += 1 if name else 0
            now = time.monotonic()
            if now - state["last"] >= PROGRESS_EVERY:
                state["last"] = now
                self.post_message(ConvertProgressed(min(int(state["bytes"]), total), total,
                                                    min(int(state["tensors"]), tensors_total), tensors_total))

        try:
            execute_convert(plan, overwrite=overwrite, progress=progress)
        except CkptError as exc:
            self.post_message(ConvertFailed("write", str(exc)))
            return
        except OSError as exc:
            self.post_message(ConvertFailed("write", f"{exc.filename or plan.dst}: {exc.strerror or exc}"))
            return
        self.post_message(ConvertFinished(plan.dst, result_path(plan), time.perf_counter() - start))

    @on(ConvertProgressed)
    def _progressed(self, message: ConvertProgressed) -> None:
        if self.stage != "writing":
            return
        self.query_one(ProgressBar).update(total=message.total, progress=message.done)
        self._status(Text.assemble("writing ", (self.plan.dst if self.plan else "", "bold"), ": ",
                                   (f"{message.tensors:,}/{message.tensors_total:,}", "bold"), " tensors · ",
                                   (human_bytes(message.done), "bold"), f" of {human_bytes(message.total)} · ",
                                   rate_eta(message.done, message.total, time.monotonic() - self._write_started)))

    @on(ConvertFinished)
    def _finished(self, message: ConvertFinished) -> None:
        self.written = message.open_path
        self._set_stage("done")
        bar = self.query_one(ProgressBar)
        bar.update(progress=bar.total)
        plan = self.plan
        what = f": {len(plan.tensors):,} tensors, {human_bytes(plan.total_bytes)}" if plan is not None else ""
        self._status(Group(Text.assemble(("✓ wrote ", "bold green"), (message.dst, "bold"), what,
                                         f" in {message.seconds:.2f} s"),
                           Text("enter / ctrl+o opens it · ctrl+r verifies the round trip · esc closes", style="dim")))
        self.query_one("#convert-open", Button).focus()

    def _set_stage(self, stage: str) -> None:
        self.stage = stage
        self.set_class(stage in ("writing", "done"), "-writing")
        editing = stage == "editing"
        mcore = str(self.query_one("#convert-target", Select).value) == "mcore"
        for field in ("#convert-target", "#convert-dtype", "#convert-dst", "#convert-overwrite", "#convert-skip-unknown",
                      "#convert-hf-config"):
            self.query_one(field).disabled = not editing
        for field in ("#convert-tp", "#convert-pp", "#convert-format", "#convert-ep", "#convert-spec"):
            self.query_one(field).disabled = not (editing and mcore)
        go = self.query_one("#convert-go", Button)
        go.display = stage != "done"
        go.disabled = stage != "editing" or bool(self.problem) or self.plan is None
        go.label = "Writing…" if stage == "writing" else "Convert"
        self.query_one("#convert-open").display = stage == "done"
        self.query_one("#convert-verify-go", Button).disabled = stage == "writing" or self.verifying
        self.query_one("#convert-cancel", Button).label = "Close" if stage == "done" else "Cancel"
        self.query_one("#convert-hint", Static).update(Text(HINTS[stage], style="dim"))

    # --- verify ------------------------------------------------------------------------------

    def action_verify(self) -> None:
        if self.stage == "writing" or self.verifying:
            return
        try:
            settings = self.settings()
        except CkptError as exc:
            self._show_verify(Text(f"✗ {exc}", style="bold red"))
            return
        self.verifying = True
        self.query_one("#convert-verify-go", Button).disabled = True
        back = "Megatron-Core" if settings.target == "hf" else "HF"
        note = (f"; dtype {settings.dtype} is not applied (verify checks the layout, not a cast)"
                if settings.dtype != "keep" else "")
        self._show_verify(Text.assemble(("verifying: ", "italic"), "source → ", (settings.label(), "cyan"),
                                        f" → {back} in a temp dir, then a bitwise diff with the source…{note}"))
        self._verify_dtype = settings.dtype
        self._verify(settings)

    @work(thread=True, exclusive=True, group="convert-verify", exit_on_error=False, description="verifying")
    def _verify(self, settings: ConvertSettings) -> None:
        from ckptscope.ops.verify import verify_round_trip

        start = time.perf_counter()
        try:
            report = verify_round_trip(self.src, via=settings.target, tp=settings.tp, pp=settings.pp,
                                       ep=settings.ep, spec=settings.spec, hf_config=settings.hf_config,
                                       ckpt_format=settings.ckpt_format, skip_unknown=settings.skip_unknown,
                                       arch=settings.arch)
        except CkptError as exc:
            self.post_message(ConvertFailed("verify", str(exc)))
            return
        except OSError as exc:
            self.post_message(ConvertFailed("verify", f"{exc.filename or ''}: {exc.strerror or exc}"))
            return
        self.post_message(ConvertVerified(report, time.perf_counter() - start))

    @on(ConvertVerified)
    def _verified(self, message: ConvertVerified) -> None:
        self.verifying = False
        self.verified = message.report
        self.query_one("#convert-verify-go", Button).disabled = self.stage == "writing"
        self._show_verify(verify_text(message.report, message.seconds, self._verify_dtype))

    def _show_verify(self, content: Text | Group) -> None:
        self.query_one("#convert-verify", Static).update(content)
        box = self.query_one("#convert-verify-box")
        box.display = True
        # On a small terminal the form is taller than the screen: bring the result into view
        self.call_after_refresh(lambda: box.scroll_visible(animate=False))

    # --- failures ----------------------------------------------------------------------------

    @on(ConvertFailed)
    def _failed(self, message: ConvertFailed) -> None:
        if message.stage == "plan":
            if message.token == self._token and self.stage == "editing":
                self._show_plan_error(message.reason)
            return
        if message.stage == "verify":
            self.verifying = False
            self.query_one("#convert-verify-go", Button).disabled = self.stage == "writing"
            self._show_verify(Group(Text("✗ verify failed", style="bold red"), Text(message.reason, style="red")))
            return
        self._set_stage("editing")  # the plan stays: Convert retries, any field change plans again
        self._status(Group(Text("✗ writing failed (nothing was left at the destination)", style="bold red"),
                           Text(message.reason, style="red")))

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """A bug in a worker is shown in the form, never as a traceback."""
        if event.state is not WorkerState.ERROR:
            return
        error = event.worker.error
        reason = f"internal error: {type(error).__name__}: {error}"
        stage = {"convert-plan": "plan", "convert-write": "write", "convert-verify": "verify"}.get(
            event.worker.group or "", "plan")
        self.post_message(ConvertFailed(stage, reason, self._token))

    # --- buttons -----------------------------------------------------------------------------

    @on(Button.Pressed, "#convert-go")
    def _go_pressed(self) -> None:
        self.action_convert()

    @on(Button.Pressed, "#convert-verify-go")
    def _verify_pressed(self) -> None:
        self.action_verify()

    @on(Button.Pressed, "#convert-open")
    def _open_pressed(self) -> None:
        self.action_open_result()

    @on(Button.Pressed, "#convert-cancel")
    def _cancel_pressed(self) -> None:
        self.action_close()

    def action_open_result(self) -> None:
        if self.written is None:
            self.notify("Nothing written yet: Convert first.", severity="information")
            return
        self.dismiss(self.written)

    def action_close(self) -> None:
        if self.stage == "writing":
            self.notify("Writing: wait until it finishes (the destination appears only when complete).",
                        severity="warning")
            return
        self.dismiss(None)
