"""Convert / merge from the browser, end to end with Pilot on copies of the shipped samples: the form's
live plan, an existing destination refused in the form, the write (checked with the safetensors
library against the transformers-written HF sample, bit for bit), "open result", and verify."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from textual.widgets import Button, Checkbox, DataTable, Input, Select, Static
from tui_helpers import settle, sync, text_of

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.screens.convert import PLAN_DELAY, ConvertScreen

SAMPLES = Path(__file__).resolve().parents[2] / "sample_ckpts"
SIZE = (140, 45)


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


async def replan(pilot) -> None:
    """Wait for the form's debounce timer, then for the plan worker and the repaint."""
    for _ in range(2):
        await pilot.pause(PLAN_DELAY + 0.1)
        await settle(pilot)


async def choose(pilot, select_id: str, value: str) -> None:
    """Pick ``value`` in a Select with the keyboard, as a user does: focus, enter, arrows, enter."""
    select = pilot.app.screen.query_one(select_id, Select)
    select.focus()
    await pilot.pause()
    values = [v for _, v in select._options]
    steps = values.index(value) - values.index(select.value)
    await pilot.press("enter", *(["down"] * steps if steps > 0 else ["up"] * -steps), "enter")
    await replan(pilot)
    assert select.value == value


async def type_into(pilot, field_id: str, value: str) -> None:
    pilot.app.screen.query_one(field_id, Input).focus()
    await pilot.press("ctrl+u", *value)
    await replan(pilot)


async def open_convert_form(pilot) -> ConvertScreen:
    """Wait for the browser, press C as a user does, and wait for the first plan."""
    await settle(pilot)
    await pilot.press("C")
    await replan(pilot)
    form = pilot.app.screen
    assert isinstance(form, ConvertScreen)
    return form


def plan_rows(screen: ConvertScreen) -> dict[str, list[str]]:
    table = screen.query_one("#convert-plan", DataTable)
    return {str(row[0]): [str(cell) for cell in row] for row in (table.get_row_at(i) for i in range(table.row_count))}


@pytest.fixture
def mcore_iter(tmp_path) -> Path:
    shutil.copytree(SAMPLES / "mcore_llama_gqa", tmp_path / "mcore_llama_gqa")
    return tmp_path / "mcore_llama_gqa" / "iter_0000000"


@sync
async def test_convert_megatron_to_hf_end_to_end(mcore_iter, tmp_path):
    before = tree_hashes(mcore_iter.parent)
    app = make_app(mcore_iter, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        browser = app.screen
        assert isinstance(browser, BrowseScreen) and browser.index is not None
        await pilot.press("C")
        await replan(pilot)
        form = app.screen
        assert isinstance(form, ConvertScreen) and not form.merge
        dst_input = form.query_one("#convert-dst", Input)
        # the target follows the other family; the default destination follows the target
        await choose(pilot, "#convert-target", "mcore")
        assert dst_input.value == str(tmp_path / "mcore_llama_gqa-mcore")
        assert not form.query_one("#convert-tp", Input).disabled
        await choose(pilot, "#convert-target", "hf")
        assert dst_input.value == str(tmp_path / "mcore_llama_gqa-hf")
        assert form.query_one("#convert-tp", Input).disabled  # tp/pp only mean something for mcore

        # the live plan: summary and one row per destination tensor with its sources and transforms
        assert form.plan is not None and form.plan.target == "hf" and not form.problem
        status = text_of(form.query_one("#convert-status", Static))
        assert f"{len(form.plan.tensors)} tensors" in status and "arch llama" in status
        assert "config.json derived from the Megatron args" in status
        rows = plan_rows(form)
        want = load_file(str(SAMPLES / "hf_llama_gqa" / "model.safetensors"))
        assert set(rows) == set(want)
        q_row = rows["model.layers.0.self_attn.q_proj.weight"]
        assert q_row[1:4] == ["(64, 64)", "float32", "qkv"]
        assert "decoder.layers.0.self_attention.linear_qkv.weight" in q_row[4]
        table = form.query_one("#convert-plan", DataTable)
        table.move_cursor(row=list(rows).index("model.layers.0.self_attn.q_proj.weight"))
        await pilot.pause()
        detail = text_of(form.query_one("#convert-detail", Static))
        assert "model.layers.0.self_attn.q_proj.weight (64, 64) float32  [qkv]" in detail
        assert "linear_qkv.weight[0:32, 0:64] → [0:32, 0:64]" in detail

        # an existing destination is refused in the form; ctrl+s writes nothing
        taken = tmp_path / "taken"
        taken.mkdir()
        await type_into(pilot, "#convert-dst", str(taken))
        assert "destination exists" in text_of(form.query_one("#convert-status", Static))
        assert form.query_one("#convert-go", Button).disabled
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert form.stage == "editing" and list(taken.iterdir()) == []

        # a free destination: enter goes to Convert, enter writes
        dst = tmp_path / "out_hf"
        await type_into(pilot, "#convert-dst", str(dst))
        assert form.plan is not None and form.plan.dst == str(dst) and not form.problem
        assert not dst.exists()
        await pilot.press("enter")
        assert form.focused is form.query_one("#convert-go", Button)
        await pilot.press("enter")
        await settle(pilot)
        assert form.stage == "done", text_of(form.query_one("#convert-status", Static))
        assert "✓ wrote" in text_of(form.query_one("#convert-status", Static))
        assert form.written == str(dst)

        # open result: the written copy is browsed over the source's browser, which stays as it was
        source_cursor = browser.query_one("#tree").cursor_line
        await pilot.press("ctrl+o")
        await settle(pilot)
        reopened = app.screen
        assert isinstance(reopened, BrowseScreen) and reopened is not browser
        assert reopened.path == str(dst)
        assert "model.layers.0.self_attn.q_proj.weight" in reopened.index.tensors
        assert "back" in [b.description for _, b, on, _ in reopened.active_bindings.values() if on]
        await pilot.press("backspace")
        await settle(pilot)
        assert app.screen is browser and browser.query_one("#tree").cursor_line == source_cursor

    got = load_file(str(dst / "model.safetensors"))
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert same_bits(got[name], tensor), name
    assert tree_hashes(mcore_iter.parent) == before, "the source changed"


@sync
async def test_verify_hf_through_megatron_tp2(tmp_path):
    src = tmp_path / "hf_llama_gqa"
    shutil.copytree(SAMPLES / "hf_llama_gqa", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        assert form.query_one("#convert-target", Select).value == "mcore"  # HF names: the other family
        await type_into(pilot, "#convert-tp", "2")
        assert form.plan is not None and (form.plan.tp, form.plan.pp) == (2, 1)
        status = text_of(form.query_one("#convert-status", Static))
        assert "tp 2 pp 1" in status and "vocabulary 250 padded to 256 rows" in status
        qkv = plan_rows(form)["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert qkv[3] == "qkv" and "model.layers.0.self_attn.q_proj.weight (2 blocks)" in qkv[4]
        embed = plan_rows(form)["embedding.word_embeddings.weight"]
        assert "zero rows 250:256" in embed[3]
        await type_into(pilot, "#convert-tp", "0")
        assert "tp must be a whole number of at least 1" in text_of(form.query_one("#convert-status", Static))
        await type_into(pilot, "#convert-tp", "2")
        await pilot.press("ctrl+r")
        await settle(pilot)
        verdict = text_of(form.query_one("#convert-verify", Static))
        assert form.verified is not None and form.verified.identical, verdict
        summary = form.verified.summary()
        assert "✓ identical" in verdict and f"{summary['equal']} of {summary['compared']} tensors" in verdict
        assert "tp 2" in verdict
        assert summary["compared"] == len(load_file(str(src / "model.safetensors")))
        assert not any(p.name.endswith("-mcore") for p in tmp_path.iterdir())  # verify writes only to a temp dir


@sync
async def test_merge_palette_and_plan_error_inline(tmp_path):
    """"ops: merge to HF…" presets hf; a source ``plan_convert`` refuses shows the reason, not a traceback."""
    src = tmp_path / "dtypes.safetensors"
    shutil.copy(SAMPLES / "dtypes.safetensors", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"ops: merge to HF")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await replan(pilot)
        form = app.screen
        assert isinstance(form, ConvertScreen) and form.merge
        assert form.query_one("#convert-target", Select).value == "hf"
        assert form.query_one("#convert-dst", Input).value == str(tmp_path / "dtypes-hf")
        status = text_of(form.query_one("#convert-status", Static))
        assert "✗ cannot plan the conversion" in status and "neither HF transformers nor Megatron-Core" in status
        assert "Traceback" not in status and form.plan is None
        assert form.query_one("#convert-go", Button).disabled
        assert form.query_one("#convert-plan", DataTable).row_count == 0
        await choose(pilot, "#convert-target", "mcore")
        assert "neither HF transformers nor Megatron-Core" in text_of(form.query_one("#convert-status", Static))
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
    assert not (tmp_path / "dtypes-hf").exists() and not (tmp_path / "dtypes-mcore").exists()


@sync
async def test_help_lists_convert_keys(tmp_path):
    from ckptscope.tui.screens.help import HelpScreen

    src = tmp_path / "hf_llama_gqa"
    shutil.copytree(SAMPLES / "hf_llama_gqa", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "ops.convert" in " ".join(text_of(s) for s in app.screen.query(".help-group"))
        await pilot.press("escape", "C")
        await replan(pilot)
        await pilot.press("ctrl+p")  # a modal form holds the app's keys ("?" in a field is typed)
        await pilot.pause()
        await pilot.press(*"view: help")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(text_of(s) for s in app.screen.query(".help-group"))
        for binding_id in ("convert.close", "convert.run", "convert.verify", "convert.open"):
            assert binding_id in text


def test_convert_bindings_have_ids_and_tooltips():
    from textual.binding import Binding

    from ckptscope.tui.app import CkptScopeApp

    ids = []
    for owner in (CkptScopeApp, ConvertScreen):
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding) and binding.id and binding.tooltip, (owner.__name__, binding)
            ids.append(binding.id)
    assert len(ids) == len(set(ids))


def _form_keys():
    async def run_before(pilot) -> None:
        await settle(pilot)
        await pilot.press("C")
        await replan(pilot)

    return run_before


def test_convert_form_snapshot(snap_compare, in_repo):
    assert snap_compare(make_app("sample_ckpts/mcore_llama_gqa/iter_0000000", keymap={}), terminal_size=SIZE,
                        run_before=_form_keys())


@sync
async def test_skip_unknown_box_turns_a_refusal_into_a_plan(tmp_path):
    """An HF dir with a stray EMA tensor: the plan refuses and says why; ticking "skip unknown"
    plans the model alone, listing the stray tensor as not written."""
    import torch
    from safetensors.torch import load_file, save_file

    src = tmp_path / "hf"
    shutil.copytree(SAMPLES / "hf_llama_single", src)
    weights = load_file(src / "model.safetensors")
    save_file({**weights, "ema.model.norm.weight": torch.ones(64, dtype=torch.bfloat16)}, src / "model.safetensors",
              metadata={"format": "pt"})
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        status = text_of(form.query_one("#convert-status", Static))
        assert "ema.model.norm.weight" in status and form.plan is None
        form.query_one("#convert-skip-unknown", Checkbox).value = True
        await replan(pilot)
        assert form.plan is not None and "ema.model.norm.weight" in form.plan.dropped
        assert not any(t.name.startswith("ema") for t in form.plan.tensors)


@sync
async def test_hf_config_field_reaches_the_plan(tmp_path):
    """megatron_style.pt's args do not fit its k/v shapes: the plan refuses and says to pass an HF
    config; typing one in the hf config field (as --hf-config) makes the plan."""
    src = tmp_path / "megatron_style.pt"
    shutil.copy(SAMPLES / "megatron_style.pt", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        form.query_one("#convert-skip-unknown", Checkbox).value = True
        await choose(pilot, "#convert-target", "hf")
        status = text_of(form.query_one("#convert-status", Static))
        assert "do not fit" in status and form.plan is None
        await type_into(pilot, "#convert-hf-config", str(SAMPLES / "hf_llama_single"))
        assert form.plan is not None and form.plan.hf_config["num_key_value_heads"] == 2
        assert form.query_one("#convert-ep", Input).disabled  # ep and spec only mean something for mcore and form.query_one("#convert-spec", Select).disabled


@sync
async def test_shard_size_and_arch_fields_reach_the_written_checkpoint(mcore_iter, tmp_path):
    """--max-shard-size and --arch have fields: a 100KB shard size writes several shards (the index
    transformers reads names them), and an architecture that does not fit the tensors stops the plan."""
    app = make_app(mcore_iter, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        await choose(pilot, "#convert-target", "hf")
        await type_into(pilot, "#convert-shard", "100KB")
        assert form.plan is not None and len(form.plan.shards) > 1
        await type_into(pilot, "#convert-dst", str(tmp_path / "out"))
        await pilot.press("ctrl+s")
        for _ in range(40):
            await settle(pilot)
            if form.stage == "done":
                break
            await pilot.pause(0.1)
        index = (tmp_path / "out" / "model.safetensors.index.json").read_text()
        shards = sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
        assert len(shards) == len(form.plan.shards) > 1 and all(s in index for s in shards)
    app = make_app(mcore_iter, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        await choose(pilot, "#convert-target", "hf")
        await choose(pilot, "#convert-arch", "qwen3_moe")
        assert form.plan is None and form.problem


@pytest.mark.parametrize(("source", "target"), [
    ("verl_run/global_step_2/actor", "hf"),  # verl FSDP: per-rank shards of an HF model, merged
    ("deepspeed_zero/zero1/global_step2", "hf"),
    ("deepspeed_zero/zero3/global_step2", "hf"),
    ("dcp_fsdp2", "hf"),
    ("megatron_torch_dist/iter_0000010", "hf"),
    ("hf_llama_sharded", "mcore"),  # a whole HF model: the other family
])
@sync
async def test_default_target_is_what_merge_does_for_training_saves(in_repo, source, target):
    """C on a training save sharded by rank presets hf (as ``ckptscope merge``), even when the
    names inside are HF names; only a whole HF model presets Megatron-Core."""
    app = make_app(f"sample_ckpts/{source}", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        assert form.query_one("#convert-target", Select).value == target
        assert form.query_one("#convert-dst", Input).value.endswith(f"-{target}")
        if source.startswith("verl"):  # its HF config is in the save: the merge plan is made at once
            assert form.plan is not None and form.plan.target == "hf", text_of(form.query_one("#convert-status", Static))


@sync
async def test_verify_result_is_in_view_at_80_columns(tmp_path):
    """At 80x24 the form is taller than the screen: the verify result is scrolled into view."""
    src = tmp_path / "hf_llama_gqa"
    shutil.copytree(SAMPLES / "hf_llama_gqa", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_convert_form(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        await pilot.pause(0.2)
        assert form.verified is not None and form.verified.identical
        shown = app.screen.find_widget(form.query_one("#convert-verify", Static)).visible_region
        assert shown.height > 0 and 0 <= shown.y < 24, shown


@pytest.fixture(scope="module")
def verl_lora_save(tmp_path_factory) -> Path:
    import importlib
    import sys

    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    lora, _only = importlib.import_module("make_verl_samples").write_verl_lora(tmp_path_factory.mktemp("verl_lora"))
    return lora


@sync
async def test_merge_lora_box_appears_for_a_lora_save_and_reaches_the_output(verl_lora_save, tmp_path):
    """A verl LoRA save plans base weights + lora_adapter/ (said in the plan); the "merge LoRA" box, shown only
    for such a save, plans and writes the merged model instead (as --merge-lora)."""
    app = make_app(verl_lora_save, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("enter")  # the iteration picker: open the latest
        form = await open_convert_form(pilot)
        box = form.query_one("#convert-merge-lora", Checkbox)
        assert form.plan is not None and form.plan.adapter is not None and box.display
        assert any("goes to lora_adapter/" in note for note in form.plan.notes)
        box.value = True
        await replan(pilot)
        assert form.plan.merge_lora and any("is merged into the base weights" in note for note in form.plan.notes)
        await type_into(pilot, "#convert-dst", str(tmp_path / "merged"))
        await pilot.press("ctrl+s")
        for _ in range(100):
            await pilot.pause(0.1)
            if (tmp_path / "merged" / "model.safetensors").exists() and form.stage == "done":
                break
    assert (tmp_path / "merged" / "model.safetensors").exists() and not (tmp_path / "merged" / "lora_adapter").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "unmerged" in p.name) == []
    plain = make_app(SAMPLES / "hf_llama_single", keymap={})
    async with plain.run_test(size=SIZE) as pilot:
        form = await open_convert_form(pilot)
        assert not form.query_one("#convert-merge-lora", Checkbox).display
