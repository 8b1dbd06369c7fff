"""The ``ckptscope`` command line: stdout carries data, stderr carries logs and errors.

Every user-facing failure is a ``CkptError`` turned into one line on stderr and exit code 2;
nothing a user types should ever end in a traceback (set ``CKPTSCOPE_DEBUG=1`` to see one).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from ckptscope import __version__
from ckptscope.cli.console import PipeSafeStdout, discard_stdout
from ckptscope.cli.roots_view import iteration_option
from ckptscope.core.errors import CkptError

EXIT_TROUBLE = 2
OPTIONAL_PACKAGES = {"torch": "PyTorch"}
"""Packages only some commands need (import name -> what to tell the user)."""


def _fail(message: str) -> "None":
    click.echo(f"ckptscope: error: {message}", err=True)
    sys.exit(EXIT_TROUBLE)


class PathDefaultGroup(click.Group):
    """``ckptscope PATH`` means ``ckptscope open PATH``: a first argument that is not a command but
    is a path (exists, or has a slash) opens the TUI (posting's DefaultGroup habit, without the
    extra dependency). Anything else is still a command name: a typo gets one line naming the commands."""

    lazy: dict[str, str] = {
        "rename": "ckptscope.cli.rename_cmd:rename",
        "check": "ckptscope.cli.check_cmd:check",
        "diff": "ckptscope.cli.diff_cmd:diff",
        "convert": "ckptscope.cli.convert_cmd:convert",
        "merge": "ckptscope.cli.convert_cmd:merge",
        "verify": "ckptscope.cli.convert_cmd:verify",
        "lora": "ckptscope.cli.lora_cmd:lora",
        "timeline": "ckptscope.cli.timeline_cmd:timeline",
        "archs": "ckptscope.cli.archs_cmd:archs",
    }
    """Command name -> ``module:attribute``: imported when that command runs (or help lists them all),
    so ``inspect`` does not pay for importing convert, diff, timeline ... (issue 15)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            import importlib

            module, attribute = self.lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = args[0] if args else ""
        if first and first not in self.commands and first not in self.lazy and not first.startswith("-") and (
                os.path.lexists(first) or os.sep in first):  # a path, even a wrong one: say so on screen
            args = ["open", *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            raise click.UsageError(f"no command or path {name!r} (commands: {', '.join(self.list_commands(ctx))}; "
                                   "a path opens the TUI)", ctx)
        return super().resolve_command(ctx, args)


def _usage_line(exc: click.UsageError) -> str:
    """Click's usage error as the house's one line: its message, and where the help is."""
    message = " ".join(exc.format_message().split())
    message = message[:1].lower() + message[1:].rstrip(".")
    if exc.ctx is not None and exc.ctx.parent is not None:  # a subcommand's option or argument
        message += f" (see '{exc.ctx.command_path} -h')"
    return message


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The version, and whether each compiled part (``core.native``) is in use: a huge header reads
    several times slower without the compiled scan, and this is where a user can see why."""
    if not value or ctx.resilient_parsing:
        return
    from ckptscope.core.native import compiled_status

    click.echo(f"ckptscope, version {__version__}")
    for what, state in compiled_status():
        click.echo(f"{what}: {state}")
    ctx.exit()


@click.group(cls=PathDefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version (and whether the compiled parts are in use) and exit.")
def cli() -> None:
    """See inside training checkpoints (safetensors, HF dirs, torch files, ...).

    `ckptscope PATH` is short for `ckptscope open PATH`.
    """


@cli.command("open")
@click.argument("path", type=click.Path(path_type=str))
@click.argument("other", required=False, type=click.Path(path_type=str))
@click.option("--trust-pickle", is_flag=True,
              help="Load pickles with real torch.load(weights_only=False). Runs code from the file: only for files you trust.")
@click.option("--light", is_flag=True, help="Start with the light theme (ctrl+t toggles).")
@iteration_option()
def open_(path: str, other: str | None, trust_pickle: bool, light: bool, iteration: int | str | None) -> None:
    """Browse a checkpoint in the terminal: tensor tree, shard layout, stats, values, objects.

    `ckptscope open A B` opens the diff screen of A and B (as `ckptscope diff A B` in a terminal), and
    exits as diff does: 0 equal, 1 different, 2 trouble."""
    from ckptscope.ops.opening import check_openable

    theme = "ckptscope-light" if light else None
    if other is not None:
        from ckptscope.cli.diff_cmd import resolve_sides

        a, b = resolve_sides(path, other, iteration, None)
        for side in (a, b):
            check_openable(side)
        _need_terminal()
        from ckptscope.ops.diff.engine import DiffOptions
        from ckptscope.tui import run_diff_tui

        sys.exit(run_diff_tui(a, b, options=DiffOptions(), trust_pickle=trust_pickle, theme=theme))
    root = None
    if iteration is not None:  # straight to that iteration; without it the TUI offers its picker
        from ckptscope.cli.roots_view import resolve

        root, path = path, resolve(path, iteration).path
    check_openable(path)  # a wrong path is one line on stderr, before the full-screen UI starts
    _need_terminal()
    from ckptscope.tui import run_tui  # lazy: only this command imports textual

    code = run_tui(path, trust_pickle=trust_pickle, theme=theme, iterations_root=root)
    if code:
        sys.exit(code)


def _need_terminal() -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CkptError("`ckptscope open` needs an interactive terminal; use `ckptscope inspect` or "
                        "`ckptscope diff --json` in scripts")


@cli.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the human view.")
@click.option("--include", multiple=True, metavar="GLOB", help="Only tensors matching GLOB (repeatable).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out tensors matching GLOB (repeatable).")
@click.option("--trust-pickle", is_flag=True,
              help="Load pickles with real torch.load(weights_only=False). Runs code from the file: only for files you trust.")
@click.option("--no-collapse", is_flag=True, help="Show every layer instead of collapsing identical ones into ranges.")
@click.option("--all-children", is_flag=True,
              help="Print every child of every module (default: the first 40, then '… N more').")
@iteration_option()
def inspect(path: str, as_json: bool, include: tuple[str, ...], exclude: tuple[str, ...], trust_pickle: bool,
            no_collapse: bool, all_children: bool, iteration: int | str | None) -> None:
    """Summarise a checkpoint: format, files, tensors, parameters, bytes per dtype, module tree.

    On a save directory, list its iterations and inspect the latest complete one (or --iteration N)."""
    from ckptscope.core.collector import collector_paused

    # Everything this command builds stays alive until it exits: the cyclic collector would only walk
    # it again and again (superlinear in tensors, issue 15).
    with collector_paused():
        _inspect(path, as_json, include, exclude, trust_pickle, no_collapse, all_children, iteration)


def _inspect(path: str, as_json: bool, include: tuple[str, ...], exclude: tuple[str, ...], trust_pickle: bool,
             no_collapse: bool, all_children: bool, iteration: int | str | None) -> None:
    from ckptscope.cli.roots_view import iterations_json, print_iterations, resolve
    from ckptscope.ops.inspect import inspect_checkpoint, report_json_chunks, report_to_json
    from ckptscope.ops.roots import describe_checkpoint

    target = resolve(path, iteration)
    report = inspect_checkpoint(target.path, include=include, exclude=exclude, trust_pickle=trust_pickle)
    # A trainer's layout (a save root, or one of its saves) by name; a plain file or dir by its format.
    layout = target.layout or describe_checkpoint(target.path, report.index)
    for warning in report.index.warnings:
        click.echo(f"ckptscope: warning: {warning}", err=True)
    if as_json:
        extra = {"layout": layout}
        if target.iterations is not None:
            extra.update(root=target.root, iterations=iterations_json(target),
                         iteration_layout=describe_checkpoint(target.path, report.index))
        if sys.stdout.isatty():
            click.echo(json.dumps(report_to_json(report) | extra, indent=2))
        else:  # the same document as json.dumps(..., indent=None) writes it, made faster (issue 15)
            out = sys.stdout  # PipeSafeStdout when piped: a reader that stops early is no error
            for piece in report_json_chunks(report, extra):
                out.write(piece)
            out.write("\n")
            out.flush()
        return
    from rich.text import Text

    from ckptscope.cli.console import stdout_console
    from ckptscope.cli.render import print_inspect

    console = stdout_console()  # piped: COLUMNS when set, else 160 (whole rows for grep), as every report
    if target.iterations is not None:
        print_iterations(target, console)
        where = os.path.relpath(target.path, target.root) if target.root else target.path
        console.print(Text.assemble(("opened", "bold"), "  ", "./ (final)" if where == "." else where, ": ",
                                    describe_checkpoint(target.path, report.index)))
    else:
        console.print(Text.assemble(("layout", "bold"), "  ", layout))
    print_inspect(report, collapse=not no_collapse, console=console, max_children=None if all_children else 40)


def load_command(args: Sequence[str]) -> None:
    """Import the module of the command ``args`` name (if they name one), as running it would:
    ``ckptscope.__main__`` does this while the collector is paused."""
    if args and not args[0].startswith("-"):
        cli.get_command(click.Context(cli), args[0])


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    from ckptscope.cli import parallel

    parallel.ARGV = list(argv) if argv is not None else sys.argv[1:]
    _unwind_on_sigterm(parallel.ARGV)
    for stream in (sys.stdout, sys.stderr):  # a tensor name with a lone surrogate prints escaped, not as a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if not sys.stdout.isatty() and not isinstance(sys.stdout, PipeSafeStdout):
        sys.stdout = PipeSafeStdout(sys.stdout)  # type: ignore[assignment]
    try:
        _main(argv)
    except SystemExit as exc:
        parallel.leave(exc.code)
        raise
    parallel.leave(0)


class Terminated(BaseException):
    """SIGTERM, SIGHUP or SIGQUIT arrived: unwind like an interrupt, so temp output is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _unwind_on_sigterm(args: Sequence[str]) -> None:
    """A killed convert left its ``.<dst>.*.tmp`` behind (SIGTERM's default ends the process at once; so do
    SIGHUP's, sent when a terminal or ssh session closes, and SIGQUIT's: a probe found 600 MB left).
    Raised as ``Terminated`` instead, it unwinds through ``atomic_output``, which removes the temp dir.
    Not for the TUI (Textual restores the terminal its own way) nor for a signal another handler owns
    (torchrun workers: ``ops.parallel.group``; ``nohup`` ignores SIGHUP)."""
    import signal
    import threading

    if args[:1] == ["open"] or threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, _frame):
        raise Terminated(signum)

    for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, stop)


def _main(argv: Sequence[str] | None) -> None:
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="ckptscope", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ckptscope: aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `ckptscope`: the help, as before
        ctx = exc.ctx
        if ctx is not None and ctx.parent is not None and isinstance(ctx.command, click.Group):
            # `ckptscope lora`: one line, as every other usage error, not a page of help
            _fail(f"{ctx.command_path}: missing command ({', '.join(ctx.command.list_commands(ctx))}); "
                  f"'{ctx.command_path} --help' explains them")
        exc.show()
        sys.exit(EXIT_TROUBLE)
    except click.UsageError as exc:  # a typo: one line, exit 2, as every other bad input
        _fail(_usage_line(exc))
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_TROUBLE if exc.exit_code == 2 else exc.exit_code)
    except CkptError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        click.echo("ckptscope: interrupted", err=True)
        sys.exit(130)
    except Terminated as stopped:
        import signal

        click.echo(f"ckptscope: terminated ({signal.Signals(stopped.signum).name}); nothing was left half-written",
                   err=True)
        sys.exit(128 + stopped.signum)
    except BrokenPipeError:  # the reader of our stdout stopped early (`| head`): not an error
        discard_stdout()
        sys.exit(0)
    except OSError as exc:
        # The disk, not ckptscope: a write that ran out of space (or past a size limit) is the
        # user's to fix, in one line; writes go to a temp location, so nothing half-written stays.
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or os.environ.get("CKPTSCOPE_DEBUG"):
            _internal_error(exc)
        # (exc.filename may be the file being copied from: not named, so it is not taken for the one written)
        _fail(f"not enough space to write the output: {exc.strerror}; nothing was left half-written")
    except ImportError as exc:
        # torch is optional: listing, checking, browsing, diffing and converting to safetensors or
        # torch_dist never need it; rewriting torch.save files, --trust-pickle and CUDA do.
        missing = (exc.name or "").split(".")[0]
        if missing not in OPTIONAL_PACKAGES or os.environ.get("CKPTSCOPE_DEBUG"):
            raise
        _fail(f"this needs {OPTIONAL_PACKAGES[missing]}, which is not installed: "
              f"pip install 'ckptscope[{missing}]' (README: Install)")
    except Exception as exc:  # a bug in ckptscope: still one line, but say it is ours
        _internal_error(exc)


def _internal_error(exc: Exception) -> NoReturn:
    if os.environ.get("CKPTSCOPE_DEBUG"):
        raise exc
    _fail(f"internal error: {type(exc).__name__}: {exc} (set CKPTSCOPE_DEBUG=1 for a traceback)")
