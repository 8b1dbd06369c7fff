"""The layering is a rule: checked by import-linter and by importing the back-end alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("import-linter is a dev dependency; install with .[dev]")
    result = subprocess.run([exe, "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower() or " 0 broken" in result.stdout.lower()


def test_backend_imports_without_ui_or_torch():
    code = (
        "import sys\n"
        "import ckptscope.core, ckptscope.formats, ckptscope.mappings, ckptscope.ops.inspect, ckptscope.ops.tree\n"
        "from ckptscope.formats import registered_readers; registered_readers()\n"
        "bad = [m for m in ('textual', 'ckptscope.tui', 'ckptscope.cli', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_cli_inspect_never_imports_torch_or_textual(samples):
    code = (
        "import sys\n"
        "from ckptscope.cli import main\n"
        "try:\n"
        f"    main(['inspect', '--json', {str(samples['hf_llama_sharded'])!r}])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "bad = [m for m in ('torch', 'textual', 'megatron') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)


def test_builtin_module_table_matches_the_readers_priorities():
    """The lazy registry imports a module when detection reaches the priority the table gives it;
    a wrong entry would let a later format sniff before an earlier one."""
    from ckptscope.formats.registry import BUILTIN_MODULES, registered_readers

    lowest: dict[str, int] = {}
    for cls in registered_readers():
        module = cls.__module__.removeprefix("ckptscope.formats.")
        lowest[module] = min(lowest.get(module, cls.priority), cls.priority)
    assert dict((m, p) for p, m in BUILTIN_MODULES) == lowest
    assert [p for p, _ in BUILTIN_MODULES] == sorted(p for p, _ in BUILTIN_MODULES)


def test_opening_a_safetensors_file_imports_only_the_readers_it_needs(samples):
    code = (
        "import sys\n"
        "from ckptscope.formats import open_checkpoint\n"
        f"open_checkpoint({str(samples['hf_llama_single'])!r} + '/model.safetensors').index()\n"
        "late = [m for m in ('megatron.legacy_reader', 'verl.reader', 'dcp.reader', 'megatron.dist_reader', 'hf.reader')\n"
        "        if 'ckptscope.formats.' + m in sys.modules]\n"
        "assert not late, late\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
