"""Every op that moves bytes shows one bar on a terminal: bytes done, bytes/s, ETA (stderr only).

The commands run in a real pseudo-terminal (stderr a tty, as a user's shell gives), and the bar's
text is read back from it. With stderr piped, nothing but the result lines appear."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_tty(*args: str, cwd: Path) -> tuple[int, str, str]:
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160", "TERM": "xterm-256color"}
    env.pop("CI", None)
    proc = subprocess.Popen([sys.executable, "-m", "ckptscope", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out = proc.stdout.read().decode()
    proc.wait()
    os.close(master)
    return proc.returncode, out, ANSI.sub("", b"".join(chunks).decode(errors="replace"))


@pytest.mark.parametrize("args, label", [
    (("convert", "{src}", "{tmp}/out", "--to", "mcore", "--tp", "2"), "writing"),
    (("rename", "{src}", "{tmp}/renamed", "--sub", "lm_head", "output"), "renaming"),
    (("diff", "{src}", "{src}"), "diff"),
])
def test_bar_shows_bytes_rate_and_eta_on_a_terminal(args, label, tmp_path):
    src = REPO / "sample_ckpts" / "hf_llama_gqa"
    argv = [a.format(src=src, tmp=tmp_path) for a in args]
    code, _, err = run_on_tty(*argv, cwd=tmp_path)
    assert code == 0, err
    assert re.search(rf"{label}\b", err) and "ETA" in err and re.search(r"\d+(\.\d+)? (B|KiB|MiB|GiB)/s", err), err


@pytest.mark.parametrize("to, tensors", [("mcore", 15), ("hf", 21)])
def test_convert_bar_counts_every_tensor_in_binary_units(to, tensors, tmp_path):
    """The tensor counter reaches the total (the Megatron writers report bytes only: each call is one
    tensor), and sizes and rate are KiB/MiB as everywhere else, never rich's decimal kB/MB."""
    src = REPO / "sample_ckpts" / "hf_llama_gqa"
    code, out, err = run_on_tty("convert", str(src), str(tmp_path / "out"), "--to", to, cwd=tmp_path)
    assert code == 0, err
    assert f"writing {tensors}/{tensors} tensors" in err, err
    assert f"{tensors} tensors" in out
    assert re.search(r"\d+\.\d/\d+\.\d (KiB|MiB) ", err) and re.search(r"\d+(\.\d+)? (B|KiB|MiB|GiB)/s", err), err
    assert not re.search(r"\d (kB|MB|GB)\b", err), err


def test_no_bar_when_stderr_is_piped(tmp_path):
    src = REPO / "sample_ckpts" / "hf_llama_gqa"
    proc = subprocess.run([sys.executable, "-m", "ckptscope", "convert", str(src), str(tmp_path / "o"), "--to", "mcore"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and "ETA" not in proc.stderr and "B/s" not in proc.stderr
