"""What a user reads from the CLI: reports fit the terminal's width with every tensor name whole,
counts agree with their nouns, the diff summary adds up, and a typo is one line with exit 2.

Every test runs the real console entry point in a subprocess (conftest.run_cli); width comes from
``COLUMNS``, as a user's shell or ``COLUMNS=80 ckptscope ... | less`` gives it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.conftest import REPO, run_cli

SAMPLES = REPO / "sample_ckpts"
RENAMED = ("model.layers.3.ffn.down_proj.weight", "model.layers.3.mlp.down_proj.weight")


def columns(width: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("COLUMNS", None)
    if width is not None:
        env["COLUMNS"] = str(width)
    return env


@pytest.fixture(scope="module")
def renamed_copy(tmp_path_factory) -> Path:
    """hf_llama_sharded with layer 3's MLP renamed (by the rename command) -> three renamed pairs."""
    dst = tmp_path_factory.mktemp("renamed") / "ffn"
    result = run_cli("rename", str(SAMPLES / "hf_llama_sharded"), str(dst), "--sub", r"layers\.3\.mlp", "layers.3.ffn")
    assert result.code == 0, result.err
    return dst


def widest(text: str, skip_first: int = 0) -> int:
    return max(len(line) for line in text.splitlines()[skip_first:])


def test_diff_at_80_columns_keeps_every_name_whole(renamed_copy):
    result = run_cli("diff", str(renamed_copy), str(SAMPLES / "hf_llama_sharded"), "--plain", env=columns(80))
    assert result.code == 1, result.err
    lines = result.out.splitlines()
    assert RENAMED[0] in lines  # the name alone on its line: never cut, folded or squeezed away
    assert f"  renamed -> {RENAMED[1]}" in lines
    assert widest(result.out, skip_first=1) <= 80, result.out  # the first line holds the two paths


def test_diff_piped_without_columns_is_one_row_per_pair(renamed_copy):
    result = run_cli("diff", str(renamed_copy), str(SAMPLES / "hf_llama_sharded"), "--plain", env=columns(None))
    assert result.code == 1, result.err
    row = next(line for line in result.out.splitlines() if line.startswith(f"│ {RENAMED[0]} "))
    assert f"renamed -> {RENAMED[1]}" in row
    assert widest(result.out, skip_first=1) <= 160


def test_diff_summary_adds_up(tmp_path):
    """2 of 3 pairs differ, by dtype and by shape: the sentence says so, the JSON keeps its flat keys."""
    np = pytest.importorskip("numpy")
    from safetensors.numpy import save_file

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"same": np.ones((2, 2), np.float32), "cast": np.ones((2, 2), np.float32),
               "grown": np.ones((2, 2), np.float32), "gone": np.ones(2, np.float32)}, a)
    save_file({"same": np.ones((2, 2), np.float32), "cast": np.ones((2, 2), np.float16),
               "grown": np.ones((2, 3), np.float32)}, b)
    result = run_cli("diff", str(a), str(b), "--plain", env=columns(80))
    assert result.code == 1, result.err
    assert ("3 pairs compared: 1 equal, 2 different (1 dtype mismatch, 1 shape mismatch); "
            "not compared: 1 only in A") in " ".join(result.out.split()), result.out  # wrapped at 80
    assert "dtype float32->float16" in result.out and "shape [2, 2]->[2, 3]" in result.out


def test_timeline_at_80_columns_keeps_module_names_and_the_latest_steps(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.conftest import load_sample_module

    root = load_sample_module("make_timeline_samples").write_timeline_hf(tmp_path)
    result = run_cli("timeline", str(root), env=columns(80))
    assert result.code == 1, result.err
    rows = [line for line in result.out.splitlines() if line.startswith("│")]
    assert any(line.startswith("│ model.layers.0.post_attention_layernorm │") for line in rows), result.out
    header = next(line for line in result.out.splitlines() if line.startswith("┃ module"))
    assert "5->6" in header and "1->2" not in header  # the oldest steps give way, the newest stay
    flat = " ".join(result.out.split())  # the title and the flag lines wrap at 80 between words
    assert "last 1 of 5 steps" in flat or "last 2 of 5 steps" in flat
    assert max(len(line) for line in rows) <= 80
    assert "1 NaN value first seen at iteration 3" in flat
    assert "KiB read in" in flat and " MB " not in flat


@pytest.mark.parametrize("width", [80, None])
def test_archs_names_are_never_broken(width):
    from ckptscope.ops.archs import arch_info

    result = run_cli("archs", "llama", env=columns(width))
    assert result.code == 0, result.err
    words = set(result.out.split())
    for tensor in arch_info("llama").tensors:
        assert tensor.mcore in words and all(hf in words for hf in tensor.hf)
    assert widest(result.out) <= (width or 160)


def test_counts_agree_with_their_nouns(tmp_path, samples):
    plan = run_cli("convert", str(SAMPLES / "megatron_torch_dist"), str(tmp_path / "x"), "--to", "hf", "--dry-run")
    assert plan.code == 0, plan.err
    assert ", 1 file\n" in plan.out.splitlines(keepends=True)[0] and "(s)" not in plan.out
    inspect = run_cli("inspect", str(samples["megatron_style.pt"]))
    assert "[1 item]" in inspect.out and "[1 items]" not in inspect.out


def test_a_typo_is_one_line_and_exit_2():
    result = run_cli("typo")
    assert result.code == 2 and result.out == ""
    assert result.err.splitlines() == [
        "ckptscope: error: no command or path 'typo' (commands: archs, check, convert, diff, inspect, lora, merge, "
        "open, rename, timeline, verify; a path opens the TUI)"]


@pytest.mark.parametrize("args, fragment", [
    (("inspect", "--nope", "x"), "no such option '--nope'"),
    (("inspect",), "missing argument 'PATH'"),
    (("convert", "a", "b", "--to", "foo"), "'foo' is not one of 'hf', 'mcore'"),
])
def test_a_subcommand_usage_error_is_one_line_and_exit_2(args, fragment):
    result = run_cli(*args)
    assert result.code == 2 and result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptscope: error: ") and fragment in lines[0], result.err
    assert f"(see 'ckptscope {args[0]} -h')" in lines[0]


def test_help_is_unchanged():
    result = run_cli("--help")
    assert result.code == 0 and result.out.startswith("Usage: ckptscope [OPTIONS] COMMAND [ARGS]...")
    assert "Commands:" in result.out


@pytest.mark.parametrize("args, code", [
    (("diff", "hf_llama_sharded", "hf_llama_single", "--plain"), 0),  # identical: `| head` must not make it 1
    (("diff", "hf_llama_sharded", "hf_llama_single", "--json"), 0),
    (("inspect", "--json", "hf_llama_sharded"), 0),
    (("inspect", "hf_llama_sharded"), 0),
])
def test_a_reader_that_stops_early_changes_no_exit_status(args, code):
    """``ckptscope ... | head -c 0``: the pipe closes under the report. The rest is discarded, no
    traceback, and the exit status is the command's own (rich and click would make it 1, which for
    diff means "different")."""
    import subprocess
    import sys

    samples = Path(__file__).resolve().parents[1] / "sample_ckpts"
    argv = [str(samples / a) if (samples / a).exists() else a for a in args]
    proc = subprocess.Popen([sys.executable, "-m", "ckptscope", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first byte: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == code, err
    assert "Traceback" not in err and "Error" not in err, err
