"""The process entry (``ckptscope`` / ``python -m ckptscope``): the collector is paused while the
command's modules load, what they loaded is frozen, and the collector is on again before the
command runs; importing ``ckptscope.cli`` alone changes nothing (issue 15, a command's fixed cost)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import gc, json, sys
sys.argv = ["ckptscope", *sys.argv[1:]]
import ckptscope.__main__ as entry
seen = {}
def fake_main():
    seen["enabled"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count()
    seen["loaded"] = sorted(m for m in sys.modules if m.startswith("ckptscope.cli.") and m.endswith("_cmd"))
import ckptscope.cli
ckptscope.cli.main = fake_main
entry.main()
print(json.dumps(seen))
"""


def _probe(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_entry_loads_the_command_then_freezes_and_turns_the_collector_back_on():
    seen = _probe("rename", "a", "b")
    assert seen["enabled"] is True
    assert seen["frozen"] > 1000  # click, the CLI and the rename command's module, out of later collections
    assert seen["loaded"] == ["ckptscope.cli.rename_cmd"]


def test_entry_without_a_command_name_loads_no_command_module():
    for args in ([], ["--help"], ["./some/path"]):
        seen = _probe(*args)
        assert seen["enabled"] is True
        assert seen["loaded"] == []


def test_importing_the_cli_leaves_the_collector_alone():
    code = "import gc, ckptscope.cli; print(gc.isenabled(), gc.get_freeze_count())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["True", "0"], proc.stderr


def test_console_script_and_module_run_the_same_entry():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["ckptscope"] == "ckptscope.__main__:main"
    proc = subprocess.run([sys.executable, "-m", "ckptscope", "no-such-command"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("ckptscope: error: no command or path 'no-such-command'")
    assert "Traceback" not in proc.stderr


def test_the_tui_loads_with_the_collector_paused_and_turns_it_back_on():
    """``make_app`` (what ``open`` and ``diff --tui`` run) loads Textual and the screens, ~300
    modules, with no cyclic collection walking them (row 9 of bench/run_all.py); then it is on again."""
    code = (
        "import gc, json, sys\n"
        "import ckptscope.core.collector  # loaded by the CLI before any command runs\n"
        "runs = []\n"
        "gc.callbacks.append(lambda phase, info: runs.append(info['generation']) if phase == 'start' else None)\n"
        "from ckptscope.tui import make_app\n"
        "assert 'textual' not in sys.modules\n"
        "app = make_app(sys.argv[1], keymap={})\n"
        "print(json.dumps({'collections': runs, 'textual': 'textual.app' in sys.modules, 'on': gc.isenabled(),"
        " 'frozen': gc.get_freeze_count()}))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "sample_ckpts" / "hf_llama_single")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["textual"] and seen["on"]
    assert seen["collections"] == []
    assert seen["frozen"] > 10_000  # CkptScopeApp froze what was loaded
