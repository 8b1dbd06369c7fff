"""Shared fixtures: tiny checkpoints written by the real writers into a session temp dir."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_sample_module(name: str = "make_samples"):
    """Import a generator script from sample_ckpts/ (it is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "sample_ckpts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def make_samples():
    return load_sample_module()


@pytest.fixture(scope="session")
def samples(tmp_path_factory, make_samples) -> dict[str, Path]:
    """Every sample from make_samples.py, freshly written for this test session."""
    out = tmp_path_factory.mktemp("samples")
    return {name: writer(out) for name, writer in make_samples.WRITERS.items()}


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> CliResult:
    """Run the real console entry point in a subprocess: real exit codes, real stdout/stderr.

    Without ``env`` the child gets this process's environment minus COLUMNS / LINES: some test
    dependency sets COLUMNS=80 at the C level (invisible in os.environ, inherited by children), and
    the CLI honours COLUMNS, so reports would depend on which tests ran first. Piped and without
    COLUMNS, as in a user's ``| grep``, reports are 160 wide (cli/console.py)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run([sys.executable, "-m", "ckptscope", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli
