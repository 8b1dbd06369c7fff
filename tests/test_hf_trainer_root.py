"""HF Trainer output dirs, written by a REAL ``transformers.Trainer`` run (a tiny Llama, 4 steps on
CPU, ``save_steps=2``): ``output_dir/checkpoint-2`` and ``checkpoint-4`` as the Trainer leaves them.

The output dir is a save root (kind ``hf-trainer``, no tracker: the newest complete checkpoint is the
default); a checkpoint is complete when its ``trainer_state.json`` (written last by
``Trainer._save_checkpoint``) is there; a ``checkpoint-N`` dir opens as an HF checkpoint with the
Trainer's files listed by role. Ground truth comes from the Trainer's own files (``trainer_state.json``
as JSON, ``training_args.bin`` through ``torch.load``) and from transformers' source.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dist_reference import assert_no_torch_on_metadata_path

from ckptscope.formats import open_checkpoint
from ckptscope.ops.check import check_checkpoint
from ckptscope.ops.roots import discover_iterations, pick_iteration

TRAIN = r'''
import shutil, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

out, final = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = (torch.arange(8) + i) % 64
        return {"input_ids": ids, "labels": ids}


args = TrainingArguments(output_dir=out, max_steps=4, save_steps=2, save_strategy="steps",
                         per_device_train_batch_size=2, learning_rate=1e-2, report_to="none", use_cpu=True,
                         logging_steps=1, disable_tqdm=True, seed=0)
trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=Tokens())
trainer.train()
shutil.copytree(out, final)
trainer.save_model(final)  # what a training script does at the end: the final model in output_dir itself
'''


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory) -> tuple[Path, Path]:
    """(output_dir with checkpoint-2/4, the same plus ``trainer.save_model()`` into output_dir)."""
    base = tmp_path_factory.mktemp("hf_trainer")
    out, final = base / "out", base / "out_final"
    proc = subprocess.run([sys.executable, "-c", TRAIN, str(out), str(final)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, final


@pytest.fixture
def output_dir(trainer_run, tmp_path) -> Path:
    root = tmp_path / "out"
    shutil.copytree(trainer_run[0], root)
    return root


@pytest.fixture
def crashed(output_dir) -> Path:
    """A third save that died before the Trainer wrote trainer_state.json (model and optimizer there)."""
    shutil.copytree(output_dir / "checkpoint-4", output_dir / "checkpoint-6")
    (output_dir / "checkpoint-6" / "trainer_state.json").unlink()
    return output_dir


def test_the_real_trainer_writes_trainer_state_last():
    """The completeness rule rests on this: ``_save_checkpoint`` saves the model, optimizer, scheduler,
    scaler and rng state, and only then ``trainer_state.json``."""
    from transformers import Trainer

    source = inspect.getsource(Trainer._save_checkpoint)
    last = source.index("TRAINER_STATE_NAME")
    for earlier in ("self.save_model(", "_save_optimizer_and_scheduler(", "_save_scaler(", "_save_rng_state("):
        assert source.index(earlier) < last, earlier


def test_layout_on_disk(trainer_run):
    out, _ = trainer_run
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    names = {p.name for p in (out / "checkpoint-4").iterdir()}
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
            "trainer_state.json", "training_args.bin"} <= names


def test_output_dir_is_a_save_root(output_dir):
    found = discover_iterations(output_dir)
    assert [(i.iteration, i.complete, i.latest, i.kind) for i in found] == [
        (4, True, True, "hf-trainer"), (2, True, False, "hf-trainer")]
    assert Path(found[0].path) == output_dir / "checkpoint-4"
    assert discover_iterations(output_dir / "checkpoint-4") is None  # a checkpoint is not a root


def test_checkpoint_opens_as_hf_with_trainer_files(output_dir):
    ckpt = output_dir / "checkpoint-4"
    with open_checkpoint(ckpt) as reader:
        index = reader.index()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert index.format == "hf" and index.iteration == state["global_step"] == 4
    assert index.metadata["trainer"]["global_step"] == 4
    roles = {f.path: f.role for f in index.files}
    assert {name: roles[name] for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin",
                                           "trainer_state.json", "model.safetensors")} == {
        "optimizer.pt": "optimizer", "scheduler.pt": "scheduler", "rng_state.pth": "rng", "training_args.bin": "args",
        "trainer_state.json": "state", "model.safetensors": "data"}
    objects = {o.name: o for o in index.objects}
    assert objects["trainer_state"].value == state
    assert not index.issues and not index.warnings
    # training_args.bin through the stub unpickler matches what torch.load (running the pickle) gives
    import torch

    real = torch.load(ckpt / "training_args.bin", weights_only=False)
    args = objects["training_args"].value
    assert args["__class__"] == "transformers.training_args.TrainingArguments"
    for field in ("learning_rate", "max_steps", "save_steps", "per_device_train_batch_size", "seed", "output_dir"):
        assert args[field] == getattr(real, field), field
    from safetensors import safe_open

    with safe_open(ckpt / "model.safetensors", "np") as f:
        assert sorted(index.tensors) == sorted(f.keys())


def test_checkpoint_index_imports_no_torch(output_dir):
    assert_no_torch_on_metadata_path(output_dir / "checkpoint-4", read="lm_head.weight")


def test_deepspeed_dir_is_listed(output_dir):
    """A DeepSpeed run leaves ``global_stepN/`` (engine.save_checkpoint) and its ``latest`` tracker in
    the Trainer checkpoint: listed with roles, never read."""
    import torch

    ckpt = output_dir / "checkpoint-4"
    (ckpt / "global_step4").mkdir()
    model_states = ckpt / "global_step4" / "mp_rank_00_model_states.pt"
    optim_states = ckpt / "global_step4" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"module": {}}, model_states)  # (zeros in their place are damage: check says so)
    torch.save({"optimizer_state_dict": {}}, optim_states)
    (ckpt / "latest").write_text("global_step4")
    with open_checkpoint(ckpt) as reader:
        index = reader.index()
    roles = {f.path: (f.role, f.size) for f in index.files}
    assert roles["global_step4/mp_rank_00_model_states.pt"] == ("deepspeed", model_states.stat().st_size)
    assert roles["global_step4/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"] == ("optimizer",
                                                                                    optim_states.stat().st_size)
    assert roles["latest"] == ("deepspeed", len("global_step4"))
    assert check_checkpoint(output_dir).ok


def test_inspect_names_the_layout(output_dir, cli):
    result = cli("inspect", str(output_dir), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["layout"] == "HF Trainer output dir (newest complete: checkpoint-4)"
    assert doc["iteration_layout"] == "HF Trainer checkpoint (step 4)"
    assert doc["path"] == str(output_dir / "checkpoint-4") and doc["format"] == "hf"
    assert [(i["iteration"], i["kind"], i["opened"]) for i in doc["iterations"]] == [
        (4, "hf-trainer", True), (2, "hf-trainer", False)]
    human = cli("inspect", str(output_dir))
    assert human.code == 0
    assert human.out.splitlines()[0].split() == ["layout", "HF", "Trainer", "output", "dir", "(newest",
                                                 "complete:", "checkpoint-4)"]
    assert "opened  checkpoint-4: HF Trainer checkpoint (step 4)" in human.out
    direct = json.loads(cli("inspect", str(output_dir / "checkpoint-2"), "--json").out)
    assert direct["layout"] == "HF Trainer checkpoint (step 2)" and "iterations" not in direct


def test_check_clean_run(output_dir, cli):
    result = cli("check", str(output_dir))
    assert result.code == 0, result.out + result.err
    assert result.out.splitlines()[0] == ("HF Trainer output dir (newest complete: checkpoint-4): "
                                          "checking iteration 4 (checkpoint-4)")
    assert TRACKER_NAME not in result.out  # no other framework's tracker is demanded
    code = cli("check", str(output_dir / "checkpoint-2"))
    assert code.code == 0 and code.out.splitlines()[0] == "HF Trainer checkpoint (step 2)"


TRACKER_NAME = "latest_checkpointed_iteration.txt"


def test_crashed_save_is_reported_by_its_own_marker(crashed, cli):
    found = discover_iterations(crashed)
    assert [(i.iteration, i.complete, i.latest) for i in found] == [(6, False, False), (4, True, True),
                                                                    (2, True, False)]
    assert pick_iteration(crashed, found).iteration == 4  # opening skips the crashed one
    result = cli("check", str(crashed), "--json")
    assert result.code == 1
    doc = json.loads(result.out)
    # transformers' get_last_checkpoint takes the highest number, so that is what a resume would load
    assert (doc["target"], doc["iteration"]) == ("checkpoint-6", 6)
    assert [(p["kind"], p["file"]) for p in doc["problems"]] == [("missing-marker", "checkpoint-6/trainer_state.json")]
    assert "checkpoint-4" in doc["problems"][0]["detail"]
    from transformers.trainer_utils import get_last_checkpoint

    assert Path(get_last_checkpoint(str(crashed))).name == "checkpoint-6"
    assert cli("check", str(crashed), "--iteration", "4").code == 0
    direct = cli("check", str(crashed / "checkpoint-6"), "--json")
    assert direct.code == 1
    assert [(p["kind"], p["file"]) for p in json.loads(direct.out)["problems"]] == [
        ("missing-marker", "trainer_state.json")]
    inspected = cli("inspect", str(crashed))
    assert inspected.code == 0 and "incomplete" in inspected.out and "opened  checkpoint-4" in inspected.out


def test_final_model_in_output_dir(trainer_run, cli):
    """``trainer.save_model()`` into output_dir: the root's own model is the ``final`` entry and the
    default (what opening output_dir opened before it was a root); checkpoints stay pickable."""
    final = trainer_run[1]
    found = discover_iterations(final)
    assert [(i.iteration, i.latest) for i in found] == [("final", True), (4, False), (2, False)]
    assert found[0].path == str(final)
    doc = json.loads(cli("inspect", str(final), "--json").out)
    assert doc["path"] == str(final) and doc["layout"] == "HF Trainer output dir (final model + 2 checkpoints)"
    assert json.loads(cli("inspect", str(final), "--step", "2", "--json").out)["path"] == str(final / "checkpoint-2")
    assert cli("check", str(final)).code == 0
    assert cli("diff", str(final), str(final / "checkpoint-4"), "--json").code == 0  # final = the last step's weights


def test_diff_convert_verify_take_an_iteration(output_dir, tmp_path, cli):
    same = cli("diff", str(output_dir), str(output_dir / "checkpoint-4"), "--json")
    assert same.code == 0, same.err
    steps = cli("diff", str(output_dir), str(output_dir), "--iteration", "2", "--iteration-b", "4", "--json")
    assert steps.code == 1, steps.err  # two more optimizer steps changed every weight
    doc = json.loads(steps.out)
    assert doc["a"].endswith("checkpoint-2") and doc["b"].endswith("checkpoint-4")
    assert doc["summary"]["different"] == doc["summary"]["compared"] > 0
    plan = json.loads(cli("convert", str(output_dir), str(tmp_path / "mc"), "--to", "mcore", "--step", "2",
                          "--dry-run", "--json").out)
    assert plan["src"] == str(output_dir / "checkpoint-2") and plan["iteration"] == 2
    written = cli("convert", str(output_dir), str(tmp_path / "mc"), "--to", "mcore", "--iteration", "2")
    assert written.code == 0, written.err
    assert (tmp_path / "mc" / "iter_0000002").is_dir()  # the Trainer's global_step became the iteration
    assert cli("diff", str(output_dir / "checkpoint-2"), str(tmp_path / "mc"), "--json").code == 0
    verified = cli("verify", str(output_dir), "--iteration", "2", "--json")
    assert verified.code == 0, verified.err
    assert json.loads(verified.out)["a"] == str(output_dir / "checkpoint-2")
