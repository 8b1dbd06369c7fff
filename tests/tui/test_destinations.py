"""The convert form's default destination lands next to the checkpoint, never inside a checkpoint
dir or a trainer's save root (where it would read as another save, or be deleted with the run)."""

from __future__ import annotations

import pytest

from ckptscope.tui.destinations import default_destination
from ckptscope.tui.renaming import default_destination as rename_destination


@pytest.mark.parametrize("source, expected", [
    ("run/iter_0000100", "run-hf"),                       # Megatron save root
    ("run/release", "run-hf"),
    ("run/global_step_10/actor", "run-hf"),               # verl
    ("out/checkpoint-500", "out-hf"),                     # HF Trainer output_dir
    ("state/pytorch_model_fsdp_0", "state-hf"),           # accelerate save_state
    ("run/iter_0000100/mp_rank_00", "run-hf"),            # one Megatron rank dir
    ("dump/checkpoint/step-4", "dump/checkpoint-hf"),     # torchtitan
    ("models/llama", "models/llama-hf"),                  # a plain model dir
])
def test_default_destination_is_beside_the_save(tmp_path, source, expected):
    src = tmp_path / source
    src.mkdir(parents=True)
    dst = default_destination(src, "hf")
    assert dst == tmp_path / expected
    assert not dst.is_relative_to(src)


def test_default_destination_skips_taken_names(tmp_path):
    src = tmp_path / "out" / "checkpoint-500"
    src.mkdir(parents=True)
    (tmp_path / "out-mcore").mkdir()
    assert default_destination(src, "mcore") == tmp_path / "out-mcore-2"


@pytest.mark.parametrize(("source", "expected"), [
    ("run/global_step_2/actor", "run-renamed"), ("run/iter_0000010", "run-renamed"),
    ("model.safetensors", "model-renamed.safetensors"), ("hf_dir", "hf_dir-renamed"),
])
def test_rename_destination_is_beside_the_save_too(tmp_path, source, expected):
    """The rename form's default never lands inside a save root (the review found
    ``verl_run/global_step_2/actor-renamed``)."""
    src = tmp_path / source
    if src.suffix:
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(b"")
    else:
        src.mkdir(parents=True)
    assert rename_destination(src) == tmp_path / expected


def test_path_completion_stops_where_the_matches_part(tmp_path):
    """As a shell's tab: one match completes whole (a folder with its /), several complete to what they
    share; the first match alone was suggested, so iter_00 became iter_0000100/ beside iter_0000200."""
    import asyncio

    from ckptscope.tui.widgets.path_suggester import PathSuggester

    for name in ("iter_0000100", "iter_0000200", "latest_checkpointed_iteration.txt"):
        (tmp_path / name).mkdir() if name.startswith("iter") else (tmp_path / name).write_text("200")

    def suggest(value: str) -> str | None:
        return asyncio.run(PathSuggester().get_suggestion(value))

    assert suggest(f"{tmp_path}/iter_00") == f"{tmp_path}/iter_0000"
    assert suggest(f"{tmp_path}/iter_0000") is None  # nothing more to complete: no guess
    assert suggest(f"{tmp_path}/iter_00002") == f"{tmp_path}/iter_0000200/"
    assert suggest(f"{tmp_path}/la") == f"{tmp_path}/latest_checkpointed_iteration.txt"
    assert suggest(f"{tmp_path}/nothing") is None
