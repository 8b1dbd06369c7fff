"""Bad input: one clear line on stderr naming the file and the problem, exit code 2, no traceback."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch
from tests.conftest import REPO, run_cli


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    assert lines[0].startswith("ckptscope: error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert result.out == ""


def test_truncated_safetensors(samples, tmp_path, cli):
    data = samples["dtypes.safetensors"].read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: len(data) - 10])
    assert_one_line_error(cli("inspect", str(path)), str(path), "truncated safetensors file")


def test_header_cut_short(samples, tmp_path, cli):
    data = samples["dtypes.safetensors"].read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:40])
    assert_one_line_error(cli("inspect", str(path)), str(path), "header needs")


def test_garbage_safetensors(tmp_path, cli):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(os.urandom(4096))
    assert_one_line_error(cli("inspect", str(path)), str(path), "not a safetensors file")


def test_bad_header_json(tmp_path, cli):
    header = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'  # missing closing brace
    path = tmp_path / "badjson.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    assert_one_line_error(cli("inspect", str(path)), str(path), "bad safetensors header JSON")


def test_header_sizes_inconsistent(tmp_path, cli):
    header = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "sizes.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    assert_one_line_error(cli("inspect", str(path)), "'w' spans 8 bytes", "needs 12")


def test_unknown_dtype(tmp_path, cli):
    header = json.dumps({"w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    path = tmp_path / "dtype.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    assert_one_line_error(cli("inspect", str(path)), "unknown safetensors dtype 'F7'")


def test_index_names_missing_shard(samples, tmp_path, cli):
    """A damaged sharded checkpoint stays browsable: the other shards are shown, with a warning
    (``ckptscope check`` reports it as a problem: tests/test_check.py)."""
    ckpt = tmp_path / "hf"
    shutil.copytree(samples["hf_llama_sharded"], ckpt)
    (ckpt / "model-00002-of-00004.safetensors").unlink()
    result = cli("inspect", str(ckpt))
    assert result.code == 0 and "Traceback" not in result.err
    assert "model.safetensors.index.json names shard model-00002-of-00004.safetensors, which is missing" in result.err


def test_index_places_tensor_in_wrong_shard(samples, tmp_path, cli):
    ckpt = tmp_path / "hf"
    shutil.copytree(samples["hf_llama_sharded"], ckpt)
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name, shard = next(iter(index["weight_map"].items()))
    other = next(s for s in sorted(set(index["weight_map"].values())) if s != shard)
    index["weight_map"][name] = other
    index_path.write_text(json.dumps(index))
    result = cli("inspect", str(ckpt))
    assert result.code == 0 and "Traceback" not in result.err
    assert f"places tensor {name!r} in {other}, which does not contain it" in result.err


def test_garbage_shard_in_hf_dir(samples, tmp_path, cli):
    ckpt = tmp_path / "hf"
    shutil.copytree(samples["hf_llama_sharded"], ckpt)
    (ckpt / "model-00003-of-00004.safetensors").write_bytes(b"\xff" * 100)
    assert_one_line_error(cli("inspect", str(ckpt)), "model-00003-of-00004.safetensors")


def test_empty_directory(tmp_path, cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(cli("inspect", str(empty)), str(empty), "empty directory")


def test_unrecognised_file_names_what_was_tried(tmp_path, cli):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert_one_line_error(cli("inspect", str(path)), str(path), "tried: ", "safetensors", "torch")


def test_missing_path_and_broken_symlink(tmp_path, cli):
    assert_one_line_error(cli("inspect", str(tmp_path / "nope")), "no such file or directory")
    link = tmp_path / "dangling.safetensors"
    link.symlink_to(tmp_path / "gone.safetensors")
    assert_one_line_error(cli("inspect", str(link)), "broken symbolic link")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read files without read permission")
def test_unreadable_file(samples, tmp_path, cli):
    path = tmp_path / "locked.safetensors"
    path.write_bytes(samples["dtypes.safetensors"].read_bytes())
    path.chmod(0)
    assert_one_line_error(cli("inspect", str(path)), str(path), "ermission denied")


def test_truncated_torch_zip(samples, tmp_path, cli):
    data = samples["megatron_style.pt"].read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(cli("inspect", str(path)), str(path), "corrupt torch zip file")


def test_truncated_legacy_file(samples, tmp_path, cli):
    data = samples["legacy_format.pt"].read_bytes()
    path = tmp_path / "cut_legacy.pt"
    path.write_bytes(data[:-20])
    assert_one_line_error(cli("inspect", str(path)), str(path), "truncated legacy torch file")


def test_torchscript_is_refused_clearly(tmp_path, cli):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    assert_one_line_error(cli("inspect", str(path)), "TorchScript archive")


def test_bad_option_is_exit_2(cli, samples):
    result = cli("inspect", "--no-such-flag", str(samples["dtypes.safetensors"]))
    assert result.code == 2 and "Traceback" not in result.err


def test_source_files_are_never_modified(samples, tmp_path, cli):
    """Reading is read-only: every byte and mtime of the checkpoint is unchanged."""
    ckpt = tmp_path / "hf"
    shutil.copytree(samples["hf_llama_sharded"], ckpt)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in ckpt.iterdir()}
    assert cli("inspect", "--json", str(ckpt)).code == 0
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in ckpt.iterdir()} == before


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux procfs")
def test_file_whose_read_fails(cli):
    """/proc/self/mem exists but reading its first byte fails with EIO, even for root."""
    assert_one_line_error(cli("inspect", "/proc/self/mem"), "/proc/self/mem", "cannot read")


@pytest.mark.parametrize("args, message", [
    (["./no/such/ckpt"], "no such file or directory"),
    (["open", "./no/such/ckpt"], "no such file or directory"),
    (["open", "/etc/hostname"], "not a checkpoint ckptscope can read"),
])
def test_open_checks_the_path_before_the_full_screen_ui(args, message):
    """A typo'd path is one line on stderr and exit 2, before any screen is drawn (even from a
    terminal: the check comes before the terminal one, so this runs the same without a tty)."""
    result = run_cli(*args)
    assert result.code == 2 and result.err.count("\n") == 1 and message in result.err
    assert "interactive terminal" not in result.err and result.out == ""


def test_open_of_two_paths_checks_both_before_the_diff_screen(tmp_path):
    """`ckptscope open A B` (and `ckptscope A B`) is the diff screen: both paths are checked first."""
    missing = run_cli("sample_ckpts/hf_llama_single", "./no/such/b")
    assert missing.code == 2 and "no/such/b: no such file or directory" in missing.err
    no_tty = run_cli("open", "sample_ckpts/hf_llama_single", "sample_ckpts/hf_llama_sharded")
    assert no_tty.code == 2 and "interactive terminal" in no_tty.err and "diff --json" in no_tty.err


@pytest.mark.parametrize("sample, damage", [
    ("megatron_legacy_tp2", "iter_0000020/mp_rank_01"),  # a TP rank: its shards read as zeros
    ("hf_llama_sharded", "model-00002-of-00004.safetensors"),  # a shard: its tensors absent
])
def test_a_damaged_model_is_not_exported(tmp_path, sample, damage):
    """Readers index what is there, for inspect and check to show; exporting that wrote a model with
    half of every weight zero (a missing TP rank) or 13 of 39 tensors missing (a missing shard), exit 0,
    and verify said "identical". Now convert, merge and verify refuse, naming the damage."""
    import shutil

    from tests.conftest import REPO, run_cli

    src = tmp_path / sample
    shutil.copytree(REPO / "sample_ckpts" / sample, src)
    target = src / damage
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    for command in (["convert", str(src), str(tmp_path / "out"), "--to", "hf"],
                    ["convert", str(src), str(tmp_path / "out"), "--to", "mcore"],
                    ["merge", str(src), str(tmp_path / "out")],
                    ["verify", str(src)]):
        result = run_cli(*command)
        assert result.code == 2, (command, result.out, result.err)
        assert "damaged" in result.err and result.err.count("\n") == 1, result.err
        assert not (tmp_path / "out").exists()


def test_destinations_that_are_never_written(tmp_path):
    """--overwrite replaces a file or a dir, never a device or a FIFO (a probe's `convert ... /dev/null
    --overwrite` as root replaced the device node); an output inside the save root the user named is the
    source tree even when an iteration dir is what is read; a --map file is an input, not a destination."""
    import os
    import shutil

    from tests.conftest import REPO, run_cli

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = run_cli("convert", str(REPO / "sample_ckpts" / "hf_llama_single"), str(fifo), "--to", "hf", "--overwrite")
    assert result.code == 2 and "device, FIFO or socket" in result.err and fifo.is_fifo(), result.err
    root = tmp_path / "root"
    shutil.copytree(REPO / "sample_ckpts" / "megatron_torch_dist", root)
    result = run_cli("merge", str(root), str(root / "merged"))
    assert result.code == 2 and "inside" in result.err and not (root / "merged").exists(), result.err
    table = tmp_path / "map.json"
    table.write_text("{}")
    result = run_cli("rename", str(REPO / "sample_ckpts" / "hf_llama_single"), str(table), "--map", str(table),
                     "--overwrite")
    assert result.code == 2 and table.read_text() == "{}", result.err


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """Every command on a FIFO blocked for ever on its first read."""
    import os

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    for command in (["inspect", str(fifo)], ["check", str(fifo)], ["diff", str(fifo), str(fifo)],
                    ["convert", str(fifo), str(tmp_path / "out"), "--to", "hf"]):
        result = run_cli(*command)
        assert result.code == 2 and "not a regular file or directory" in result.err, (command, result.err)


@pytest.mark.parametrize("key, value, said", [("num_hidden_layers", 10**30, "up to 10,000"),
                                              ("num_attention_heads", "4", "'4', not a whole number"),
                                              ("vocab_size", -5, "-5, not a whole number"),
                                              ("hidden_size", 0, "0, not a positive integer")])
def test_implausible_config_sizes_are_refused(tmp_path, key, value, said):
    """A layer count of 1e30 made convert loop for ever; a size spelled as a string ended in an internal
    TypeError."""
    import shutil

    from tests.conftest import REPO, run_cli

    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_single", src)
    config = json.loads((src / "config.json").read_text())
    config[key] = value
    (src / "config.json").write_text(json.dumps(config))
    for to in ("hf", "mcore"):
        result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", to)
        assert result.code == 2 and said in result.err and result.err.count("\n") == 1, result.err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGQUIT"])
def test_a_stopping_signal_removes_the_temporary_output(tmp_path, signame):
    """SIGTERM ended a convert at once and left its .<dst>.*.tmp (939 MB in the probe), and so did SIGHUP
    (a closed terminal or ssh session) and SIGQUIT (600 MB): each now unwinds like an interrupt, exit
    128 + the signal, one line, no temp dir, no destination."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    sys.path.insert(0, str(REPO / "bench"))
    import data

    data.llama_hf(path=str(tmp_path / "src"), gb=0.3)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    signum = getattr(signal, signame)
    # A job a non-interactive shell starts in the background inherits SIGQUIT (and SIGINT) ignored, and
    # ckptscope leaves an ignored signal ignored (as under nohup): the child gets the default, as from a terminal.
    proc = subprocess.Popen([sys.executable, "-m", "ckptscope", "convert", str(tmp_path / "src"),
                             str(tmp_path / "out"), "--to", "hf", "--dtype", "float32"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.*.tmp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("the conversion finished before it could be interrupted")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum and f"terminated ({signame})" in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob(".out.*")) and not (tmp_path / "out").exists()


def test_a_temp_dir_a_killed_process_left_is_removed_by_the_next_write(tmp_path):
    """SIGKILL cannot be unwound: its ``.<dst>.<pid>.*.tmp`` stays, and every rerun added another. The next
    write to that parent removes those of processes that no longer run, never a live one's or another name."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.{int(dead.stdout)}.abc123.tmp"
    (stale / "out").mkdir(parents=True)
    live = tmp_path / f".out.{os.getppid()}.def456.tmp"
    live.mkdir()
    other = tmp_path / ".out.notapid.tmp"
    other.mkdir()
    result = run_cli("convert", str(REPO / "sample_ckpts" / "hf_llama_single"), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 0, result.err
    assert not stale.exists() and live.is_dir() and other.is_dir() and (tmp_path / "out" / "config.json").is_file()


def test_config_vocab_that_disagrees_with_the_embedding_is_refused(tmp_path, cli):
    """config.json says 64 more tokens than the embedding has (transformers refuses to load it): the
    export padded the table on, and the way back gave a model with 64 zero rows, exit 0."""
    src = tmp_path / "hf"
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_gqa", src)
    config = json.loads((src / "config.json").read_text())
    rows = config["vocab_size"]
    config["vocab_size"] = rows + 64
    (src / "config.json").write_text(json.dumps(config))
    assert_one_line_error(cli("convert", str(src), str(tmp_path / "out"), "--to", "mcore"),
                          f"vocab_size is {rows + 64}", f"has {rows} rows")
    assert not (tmp_path / "out").exists()


def test_damaged_torch_dist_marker_is_reported_by_check(tmp_path, cli):
    """metadata.json (Megatron-Core's completion marker) that is not JSON: the dir passed `check` as a
    plain DCP dir; it is now a torch_dist save with an unreadable-file problem (exit 1)."""
    root = tmp_path / "save"
    shutil.copytree(REPO / "sample_ckpts" / "megatron_torch_dist", root)
    step = root / "iter_0000010"
    (step / "metadata.json").write_text("{not json")
    result = cli("check", str(step))
    assert result.code == 1, (result.out, result.err)
    assert "torch_dist" in result.out.splitlines()[0]
    assert "unreadable-file: metadata.json: not Megatron-Core's completion marker" in result.out
    intact = cli("check", str(REPO / "sample_ckpts" / "megatron_torch_dist" / "iter_0000010"))
    assert intact.code == 0, intact.out


def test_diff_json_and_plain_together_are_refused(cli):
    sample = str(REPO / "sample_ckpts" / "hf_llama_gqa")
    assert_one_line_error(cli("diff", "--json", "--plain", sample, sample), "--json and --plain")


def _edit_dcp_metadata(path, edit):
    """Rewrite a DCP ``.metadata`` (torch's own pickle of its Metadata dataclasses) after ``edit``."""
    import pickle

    with open(path, "rb") as fh:
        metadata = pickle.load(fh)
    edit(metadata)
    with open(path, "wb") as fh:
        pickle.dump(metadata, fh)


def _lost_chunk(metadata):
    metadata.state_dict_metadata["embedding.word_embeddings.weight"].chunks.pop()


def _overlapping_chunk(metadata):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    chunks = metadata.state_dict_metadata["embedding.word_embeddings.weight"].chunks
    chunks[1] = ChunkStorageMetadata(offsets=chunks[0].offsets, sizes=chunks[1].sizes)


def _lost_storage(metadata):
    for key in [k for k in metadata.storage_data if k.fqn == "embedding.word_embeddings.weight"]:
        del metadata.storage_data[key]


@pytest.mark.parametrize("damage, said", [(_lost_chunk, "hole in embedding.word_embeddings.weight"),
                                          (_overlapping_chunk, "overlap in embedding.word_embeddings.weight"),
                                          (_lost_storage, "its 0 chunks cover 0 of 16384")])
def test_a_model_whose_metadata_leaves_a_hole_is_not_exported_or_renamed(tmp_path, damage, said):
    """A torch_dist save (megatron-core's, shipped) whose ``.metadata`` lost a chunk, holds two chunks at
    one place, or lost a tensor's storage entries: `check` said so (exit 1), but convert, merge, verify
    and rename exited 0, the export with the embedding's uncovered rows zero (a probe)."""
    pytest.importorskip("torch")
    import shutil

    from tests.conftest import REPO, run_cli

    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "megatron_torch_dist", src)
    _edit_dcp_metadata(src / "iter_0000010" / ".metadata", damage)
    assert run_cli("check", str(src)).code == 1
    for command in (["convert", str(src), str(tmp_path / "out"), "--to", "hf"],
                    ["convert", str(src), str(tmp_path / "out"), "--to", "mcore"],
                    ["merge", str(src), str(tmp_path / "out")], ["verify", str(src)],
                    ["rename", str(src / "iter_0000010"), str(tmp_path / "out"), "--sub", "word_", "w_"]):
        result = run_cli(*command)
        assert result.code == 2 and "damaged" in result.err and said in result.err, (command, result.err)
        assert result.err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_verl_save_with_one_rank_file_copied_over_another_is_not_merged(tmp_path):
    """verl's FSDP shards say which part of each tensor they hold: rank 0's file copied over rank 1's
    leaves the second half of every tensor stored nowhere (`check`: 21 holes). merge, convert and verify
    exited 0 and wrote those halves as zeros (a probe)."""
    import shutil

    from tests.conftest import REPO, run_cli

    src = tmp_path / "run"
    shutil.copytree(REPO / "sample_ckpts" / "verl_run", src)
    actor = src / "global_step_2" / "actor"
    shutil.copy(actor / "model_world_size_2_rank_0.pt", actor / "model_world_size_2_rank_1.pt")
    assert run_cli("check", str(src)).code == 1
    for command in (["merge", str(src), str(tmp_path / "out")], ["convert", str(src), str(tmp_path / "out"), "--to",
                                                                  "mcore"], ["verify", str(src)]):
        result = run_cli(*command)
        assert result.code == 2 and "hole in model." in result.err and "stored nowhere" in result.err, result.err
        assert result.err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_symbolic_link_loop_is_said_as_such_by_every_writing_command(tmp_path):
    """convert/merge with a link loop as the source, or convert/rename with one as the destination, said
    "internal error: RuntimeError: Symlink loop" (a probe)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop, sample = str(tmp_path / "a"), str(REPO / "sample_ckpts" / "hf_llama_single")
    for command in (["convert", loop, str(tmp_path / "out"), "--to", "hf"], ["merge", loop, str(tmp_path / "out")],
                    ["convert", sample, loop, "--to", "hf"], ["rename", sample, loop, "--sub", "lm_", "x_", "--overwrite"]):
        result = run_cli(*command)
        assert result.code == 2 and "symbolic link loop" in result.err and "internal" not in result.err, result.err
        assert result.err.count("\n") == 1


def test_a_dcp_item_whose_offset_misses_its_zip_is_a_clear_error(tmp_path):
    """A ``.metadata`` whose storage offset for one item points 64 bytes past its embedded zip gave
    "internal error: OSError: seek before the start of the item" (a probe)."""
    import dataclasses
    import warnings

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": load_file(REPO / "sample_ckpts" / "hf_llama_single" / "model.safetensors")},
                 checkpoint_id=tmp_path / "dcp", no_dist=True)

    def shift(metadata):
        for key, info in list(metadata.storage_data.items()):
            if key.fqn == "model.model.embed_tokens.weight":
                metadata.storage_data[key] = dataclasses.replace(info, offset=info.offset + 64)

    _edit_dcp_metadata(tmp_path / "dcp" / ".metadata", shift)
    result = run_cli("convert", str(tmp_path / "dcp"), str(tmp_path / "out"), "--to", "hf", "--hf-config",
                     str(REPO / "sample_ckpts" / "hf_llama_single"))
    assert result.code == 2 and "corrupt torch zip file" in result.err and "internal" not in result.err, result.err
    assert result.err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_diff_of_infinities_says_nothing_but_its_report(tmp_path):
    """A tensor holding +inf and -inf (or an fp16 signalling NaN) made numpy print RuntimeWarnings on
    stderr beside the report, --json included (a probe)."""
    import numpy as np
    from safetensors.numpy import save_file

    a = np.linspace(-1, 1, 300, dtype=np.float32)
    a[:2] = [np.inf, -np.inf]
    save_file({"w": a}, str(tmp_path / "a.safetensors"))
    save_file({"w": a * 2}, str(tmp_path / "b.safetensors"))
    half = np.arange(64, dtype=np.uint16).view(np.float16).copy()
    half.view(np.uint16)[:4] = 0x7D00  # signalling NaN bits
    save_file({"h": half}, str(tmp_path / "c.safetensors"))
    save_file({"h": half + np.float16(1)}, str(tmp_path / "d.safetensors"))
    for x, y in (("a", "b"), ("c", "d")):
        for extra in ([], ["--json"]):
            result = run_cli("diff", str(tmp_path / f"{x}.safetensors"), str(tmp_path / f"{y}.safetensors"), *extra)
            assert result.code == 1 and result.err == "", result.err



def test_usage_slips_are_one_clear_line(tmp_path):
    """`ckptscope lora` printed 11 lines of help; `diff --arch nonsense` was ignored when the pair needed
    no mapping; a config.json that is a JSON array was reported as missing; the formats tried listed one
    name twice (a probe)."""
    lora = run_cli("lora")
    assert lora.code == 2 and lora.err.count("\n") == 1 and "missing command (merge, stats)" in lora.err, lora.err
    sample = str(REPO / "sample_ckpts" / "hf_llama_single")
    typo = run_cli("diff", sample, sample, "--arch", "nonsense")
    assert typo.code == 2 and "unknown architecture 'nonsense'" in typo.err and typo.out == "", typo.err
    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_single", src)
    (src / "config.json").write_text("[1, 2]")
    result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "config.json is not an HF model config" in result.err, result.err
    # a single file beside a good config.json: the file is read on its own, and the line says so (it called
    # the good config "not an HF model config", a probe)
    single = run_cli("convert", str(REPO / "sample_ckpts" / "hf_llama_single" / "model.safetensors"),
                     str(tmp_path / "out_single"), "--to", "hf")
    assert single.code == 2 and single.err.count("\n") == 1 and "without the config.json beside it" in single.err \
        and "not an HF model config" not in single.err, single.err
    (tmp_path / "empty.bin").write_bytes(b"not a checkpoint")
    unknown = run_cli("inspect", str(tmp_path / "empty.bin"))
    tried = unknown.err.split("tried: ", 1)[1].strip().split(", ")
    assert unknown.code == 2 and len(tried) == len(set(tried)), unknown.err


def test_an_export_of_a_save_whose_completion_marker_is_damaged_says_so(tmp_path):
    """A torch_dist save whose metadata.json (Megatron-Core's completion marker) is not JSON: inspect warned
    "the save may not have finished" and check reported it, but convert --to hf said nothing (a probe). The
    tensors are whole (their own metadata says so), so the export goes on, with that warning on stderr."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "megatron_torch_dist", src)
    (src / "iter_0000010" / "metadata.json").write_text('{"sharded_backend": ')
    result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 0 and "warning: metadata.json:" in result.err and "may not have finished" in result.err
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_unmapped_tensors_are_explained_for_the_layouts_probes_met():
    """Megatron-Core saves a probe wrote (megatron-core 0.16.1): a Qwen3-MoE with a dense first layer
    (``moe_layer_freq=[0, 1]``) and a Llama with learned absolute positions were refused with "pass --arch",
    which no architecture answers. The line now says what is not supported (Qwen MoE's dense layers now
    convert: test_qwen_moe_dense_layers.py; a Mixtral has no way to say them)."""
    from ckptscope.ops.convert.plan import _unmapped_hint

    dense = ["decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.0.mlp.linear_fc2.weight"]
    assert "have no place in mixtral" in _unmapped_hint(dense, "mixtral")
    assert "RoPE" in _unmapped_hint(["embedding.position_embeddings.weight"], "llama")
    assert _unmapped_hint(["decoder.layers.0.self_attention.odd.weight"], "llama") == "pass --arch or report the layout"


@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_a_pipeline_split_megatron_cannot_build_is_refused_in_both_formats(tmp_path, fmt):
    """Layers that do not split evenly over the stages: the per-rank torch writer refused them, torch_dist wrote
    args (a probe: num_layers 3, pipeline size 2, no uneven-stage args) that megatron-core cannot build."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_single", src)
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    pp = 3
    assert layers > pp and layers % pp  # (4 layers over 3 stages)
    out = tmp_path / "out"
    result = run_cli("convert", str(src), str(out), "--to", "mcore", "--pp", str(pp), "--ckpt-format", fmt)
    assert result.code == 2 and "do not split evenly" in result.err and not out.exists(), result.err


@pytest.mark.parametrize("key, value, said", [
    ("num_hidden_layers", 10**15, "more than any model has"),  # the per-layer rules built a set that large
    ("architectures", [4], "not a list of strings"),  # inspect's summary joined it: TypeError
    ("rms_norm_eps", "1e-6", "not a finite number"),
    ("qk_rope_head_dim", {}, "not a whole number"),  # DeepSeek's MLA shapes: TypeError
    ("first_k_dense_replace", "abc", "not a whole number"),
    ("sliding_window", [], "not a whole number"),
    ("layer_types", float("nan"), "not a list of strings"),
    ("mlp_only_layers", [1.5], "not a list of layer numbers"),
    ("tie_word_embeddings", "yes", "not true or false"),
])
def test_config_values_of_the_wrong_type_are_one_line(tmp_path, key, value, said):
    """A probe damaged config.json keys one at a time: values of another type made the mappings fail with
    "internal error: TypeError" (or, for 10**15 layers, hang); now one line naming the key, exit 2, on the
    way to Megatron and as --hf-config on the way back. inspect still shows the checkpoint."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "hf_llama_single", src)
    config = json.loads((src / "config.json").read_text())
    config[key] = value
    (src / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", "mcore")
    assert result.code == 2 and f"config.json: {key} is" in result.err and said in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    result = run_cli("convert", str(REPO / "sample_ckpts" / "mcore_llama_gqa"), str(tmp_path / "back"), "--to", "hf",
                     "--hf-config", str(src))
    assert result.code == 2 and f"config.json: {key} is" in result.err, result.err
    assert run_cli("inspect", str(src)).code == 0


@pytest.mark.parametrize("attr, value, said", [("hidden_size", {"a": 1}, "hidden_size is"),
                                               ("hidden_size", "nan", "hidden_size is"),
                                               ("hidden_size", [4096], "hidden_size is"),
                                               ("norm_epsilon", [], "norm_epsilon is [], not a number"),
                                               ("norm_epsilon", "", "norm_epsilon is '', not a number"),
                                               # (a probe: "internal error: ... format string passed to dict")
                                               ("rotary_percent", {"a": 1}, "rotary_percent is {'a': 1}, not a number"),
                                               ("rotary_percent", "abc", "rotary_percent is 'abc', not a number"),
                                               ("rotary_percent", [], "rotary_percent is [], not a number"),
                                               # (read as set: a tied head exported untied, exit 0)
                                               ("untie_embeddings_and_output_weights", "abc",
                                                "untie_embeddings_and_output_weights is 'abc', not true or false"),
                                               ("swiglu", "False", "swiglu is 'False', not true or false"),
                                               ("add_qkv_bias", [], "add_qkv_bias is [], not true or false")])
def test_megatron_args_of_the_wrong_type_are_one_line(tmp_path, attr, value, said):
    """A probe set a torch_dist save's args.hidden_size to a dict or a string: convert said "internal error:
    TypeError" (the head size was derived before the shapes were checked); a norm_epsilon of [] failed where the
    args are compared with the HF config."""
    import torch

    src = tmp_path / "src"
    shutil.copytree(REPO / "sample_ckpts" / "megatron_torch_dist", src)
    common = next(src.glob("iter_*/common.pt"))
    state = torch.load(common, map_location="cpu", weights_only=False)
    setattr(state["args"], attr, value)
    torch.save(state, common)
    result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and said in result.err and "internal error" not in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_a_signal_the_moment_the_temp_dir_exists_leaves_nothing(tmp_path, monkeypatch):
    """The SIGQUIT case above failed twice in CI: the signal (sent the moment ``.out.*.tmp`` appeared) landed
    between the temp dir's creation and the ``try`` that removes it. Here the interrupt comes exactly then."""
    import os

    from ckptscope.ops.atomic import atomic_output

    real_mkdir = os.mkdir

    def mkdir_then_interrupted(path, mode=0o777, *args, **kwargs):
        real_mkdir(path, mode, *args, **kwargs)
        raise KeyboardInterrupt  # what the stopping signal's handler raises

    monkeypatch.setattr(os, "mkdir", mkdir_then_interrupted)
    with pytest.raises(KeyboardInterrupt), atomic_output(tmp_path / "out", directory=True):
        pass
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
