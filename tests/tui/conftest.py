"""Fixtures for driving the TUI: the shipped samples by relative path (stable snapshots), a
helper that waits until the app's thread workers are done, and no blinking cursors."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_cursor_blink(monkeypatch):
    """A blinking cursor makes screenshots differ run to run (harlequin's conftest does the same)."""
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None, raising=False)


@pytest.fixture
def in_repo(monkeypatch) -> Path:
    """Run from the repository root so sample paths are relative and snapshots stable."""
    monkeypatch.chdir(REPO)
    return REPO


