"""formats.filefill: an output file of planned size filled at offsets, from several threads at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import zlib

import pytest

from ckptscope.core.errors import CkptError
from ckptscope.formats import filefill
from ckptscope.formats.filefill import PIECE, OutputFile


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "source.bin"
    path.write_bytes(os.urandom(3 * PIECE + 12345))
    return path


def test_copies_land_at_their_offsets_with_the_crc_of_the_copied_bytes(tmp_path, source):
    data = source.read_bytes()
    out = tmp_path / "out.bin"
    with OutputFile(out, 10 + len(data) - 7) as target:
        target.write(0, b"0123456789")
        crc = target.copy(source, 7, 10, len(data) - 7, 0)
    assert out.read_bytes() == b"0123456789" + data[7:]
    assert crc == zlib.crc32(data[7:])


def test_threads_fill_one_file_side_by_side(tmp_path, source):
    """Pieces copied by 4 threads in any order, boundaries off the page grid, give the exact file."""
    data = source.read_bytes()
    cuts = [0, 4097, PIECE + 3, 2 * PIECE - 1, 2 * PIECE + 5000, len(data)]
    jobs = list(zip(cuts, cuts[1:]))
    out = tmp_path / "out.bin"
    crcs: dict[int, int] = {}
    with OutputFile(out, len(data)) as target:
        def work(job):
            lo, hi = job
            crcs[lo] = target.copy(source, lo, lo, hi - lo, 0)
        threads = [threading.Thread(target=work, args=(job,)) for job in reversed(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert out.read_bytes() == data
    assert all(crcs[lo] == zlib.crc32(data[lo:hi]) for lo, hi in jobs)


def test_without_fallocate_the_same_writes_work(tmp_path, source, monkeypatch):
    """A filesystem without ``fallocate`` (some network and FUSE ones): the file is only sized."""
    monkeypatch.setattr(filefill, "_fallocate", lambda fd, size: False)
    data = source.read_bytes()
    out = tmp_path / "out.bin"
    with OutputFile(out, len(data)) as target:
        assert not target.reserved
        target.copy(source, 0, 0, len(data))
    assert out.read_bytes() == data


def test_blocks_are_reserved_up_front(tmp_path):
    out = tmp_path / "out.bin"
    with OutputFile(out, 8 << 20) as target:
        if not target.reserved:
            pytest.skip("this filesystem has no fallocate")
        assert os.stat(out).st_blocks * 512 >= 8 << 20


def test_a_truncated_source_is_one_clear_error(tmp_path, source):
    out = tmp_path / "out.bin"
    with OutputFile(out, 4 * PIECE) as target, pytest.raises(CkptError, match="truncated"):
        target.copy(source, PIECE, 0, 4 * PIECE)


def test_bytes_outside_the_planned_size_are_refused(tmp_path, source):
    with OutputFile(tmp_path / "out.bin", 100) as target:
        with pytest.raises(CkptError, match="outside the planned"):
            target.write(90, b"x" * 11)
        with pytest.raises(CkptError, match="outside the planned"):
            target.copy(source, 0, 50, 51)


def test_no_space_is_said_before_anything_is_written(tmp_path):
    """A file larger than the process may write (RLIMIT_FSIZE, as a full disk would) fails at the
    reservation with one line, not later in the middle of the copy."""
    out = tmp_path / "big.bin"
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
        "from ckptscope.core.errors import CkptError\n"
        "from ckptscope.formats.filefill import OutputFile\n"
        "try:\n"
        f"    OutputFile({str(out)!r}, 8 << 20)\n"
        "except CkptError as exc:\n"
        "    print(exc); sys.exit(2)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 2, proc.stderr
    assert "not enough space" in proc.stdout


def _limited(limit: int):
    """A child that may write files of at most ``limit`` bytes, as on a nearly full disk."""
    def set_limit() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


@pytest.mark.parametrize("to", ["mcore", "hf"])
def test_convert_onto_a_full_disk_is_one_line_and_leaves_nothing(samples, tmp_path, to):
    """Both targets reserve their files before writing: exit 2, one line naming the space, and
    neither a partial output nor the temp dir left behind; the source is untouched."""
    src = samples["hf_llama_sharded"]
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    dst = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run([sys.executable, "-m", "ckptscope", "convert", str(src), str(dst), "--to", to],
                          capture_output=True, text=True, env=env, timeout=120, preexec_fn=_limited(4096))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not enough space" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_convert_refuses_up_front_what_the_disk_cannot_hold(tmp_path):
    """``check_space`` reads the real free space of the destination's filesystem."""
    from ckptscope.ops.atomic import check_space

    free = shutil.disk_usage(tmp_path).free
    check_space(tmp_path, free // 2)
    with pytest.raises(CkptError, match="not enough space: the output needs about"):
        check_space(tmp_path, free + (1 << 40))


def test_a_copy_that_fails_half_way_is_one_line_and_leaves_nothing(samples, tmp_path):
    """The threads filling the shards: one thread's error ends the command with its one line,
    and neither the output nor its temp dir is left behind."""
    from safetensors import safe_open

    src = samples["hf_llama_sharded"]
    names = []
    for shard in sorted(src.glob("*.safetensors")):
        with safe_open(str(shard), "np") as handle:
            names += list(handle.keys())
    victim = names[len(names) // 2]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["CKPTSCOPE_FAIL_ON_TENSOR"] = victim
    proc = subprocess.run([sys.executable, "-m", "ckptscope", "convert", str(src), str(tmp_path / "out"),
                           "--to", "hf"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["ckptscope: error: failure injected by CKPTSCOPE_FAIL_ON_TENSOR"]
    assert list(tmp_path.iterdir()) == []
