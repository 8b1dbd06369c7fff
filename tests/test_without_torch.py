"""ckptscope without PyTorch: what `pip install ckptscope` (no `torch` extra) gives.

Each command runs in a fresh interpreter where importing torch (or megatron) fails exactly as it
does when the package is not installed (a meta-path finder that raises ImportError with the
module's name, loaded through sitecustomize). Metadata and byte-level work must succeed; what
needs torch must say so in one line and exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_ckpts"

BLOCKER = textwrap.dedent('''
    import sys

    class _NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "megatron"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
''')


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("no_torch_site")
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    return env


def run(env: dict[str, str], *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptscope", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_the_blocker_blocks(no_torch_env):
    proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=no_torch_env)
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr


@pytest.mark.parametrize("args", [
    ("inspect", "sample_ckpts/hf_llama_sharded"),
    ("inspect", "sample_ckpts/megatron_torch_dist", "--json"),
    ("inspect", "sample_ckpts/megatron_style.pt"),
    ("inspect", "sample_ckpts/megatron_legacy_tp2"),
    ("check", "sample_ckpts/megatron_legacy_tp2"),
    ("check", "sample_ckpts/dcp_fsdp2"),
    ("diff", "sample_ckpts/hf_llama_single", "sample_ckpts/hf_llama_sharded", "--plain"),
])
def test_metadata_and_diff_commands_run_without_torch(no_torch_env, args):
    proc = run(no_torch_env, *args)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args", [
    ("rename", "sample_ckpts/hf_llama_single", "{out}", "--sub", "model.layers", "model.blocks"),
    ("convert", "sample_ckpts/hf_llama_single", "{out}", "--to", "mcore"),
    ("convert", "sample_ckpts/megatron_torch_dist", "{out}", "--to", "hf"),
])
def test_writes_to_safetensors_and_torch_dist_run_without_torch(no_torch_env, tmp_path, args):
    out = tmp_path / "out"
    proc = run(no_torch_env, *(a.format(out=out) for a in args))
    assert proc.returncode == 0, proc.stderr
    assert out.exists()


@pytest.mark.parametrize("args", [
    ("inspect", "sample_ckpts/megatron_style.pt", "--trust-pickle"),
    ("convert", "sample_ckpts/hf_llama_single", "{out}", "--to", "mcore", "--ckpt-format", "torch"),
    ("rename", "sample_ckpts/megatron_style.pt", "{out}", "--sub", "^model\\.model\\.", "model.decoder."),
])
def test_what_needs_torch_says_so_in_one_line(no_torch_env, tmp_path, args):
    """... and says it first: rename printed its whole plan on stdout before the error (a newcomer's probe)."""
    out = tmp_path / "out"
    proc = run(no_torch_env, *(a.format(out=out) for a in args))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "needs PyTorch" in proc.stderr and "ckptscope[torch]" in proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_the_browser_opens_without_torch(no_torch_env):
    """The TUI on a torch.save file: tree, header and a tensor's stats, with torch unavailable."""
    script = textwrap.dedent('''
        import asyncio, sys
        from ckptscope.tui.app import make_app
        from ckptscope.tui.screens.browse import BrowseScreen
        from ckptscope.tui.widgets.summary_header import SummaryHeader

        async def main():
            app = make_app("sample_ckpts/megatron_style.pt", keymap={})
            async with app.run_test(size=(120, 36)) as pilot:
                for _ in range(50):
                    await pilot.pause(0.1)
                    screen = app.screen
                    if isinstance(screen, BrowseScreen) and screen.query_one(SummaryHeader).index is not None:
                        break
                index = app.screen.query_one(SummaryHeader).index
                assert index is not None and len(index) > 0, "no index"
                await pilot.press("s")
                await pilot.pause(1.0)
            assert "torch" not in sys.modules
            print("ok", len(index))

        asyncio.run(main())
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=no_torch_env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]


def test_rename_asks_for_torch_before_its_plan_when_torch_is_absent(tmp_path):
    """The check rename makes before printing its plan: ``importlib.util.find_spec("torch")`` is None when
    torch is not installed (this blocker makes it so; the module's one raises from ``find_spec`` instead)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    out = tmp_path / "out.pt"
    proc = run(env, "rename", "sample_ckpts/megatron_style.pt", str(out), "--sub", "^model\\.model\\.", "model.decoder.")
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists(), proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "needs PyTorch" in proc.stderr, proc.stderr
