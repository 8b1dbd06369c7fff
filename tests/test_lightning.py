"""A PyTorch Lightning checkpoint (``sample_ckpts/lightning``, written by Lightning 2.6.6's Trainer and
ModelCheckpoint: ``make_lightning_samples.py``). Its ``callbacks`` hold ModelCheckpoint's tensors
(``kth_value``, ``best_model_score``): taken for model tensors, they made ``diff`` against the model's
own weights say "different" (exit 1) and ``convert`` refuse without --skip-unknown."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.conftest import run_cli

SAMPLE = Path(__file__).resolve().parents[1] / "sample_ckpts" / "lightning"
CKPT = SAMPLE / "ckpts" / "last.ckpt"


def test_diff_against_the_models_own_weights_is_identical():
    result = run_cli("diff", "--json", str(CKPT), str(SAMPLE / "reference.safetensors"))
    report = json.loads(result.out)
    assert result.code == 0 and report["identical"], report["summary"]
    assert report["summary"]["equal"] == report["summary"]["compared"] > 0


def test_callbacks_and_loops_are_training_state():
    data = json.loads(run_cli("inspect", "--json", str(CKPT)).out)
    roles = {t["name"]: t["role"] for t in data["tensors"]}
    callbacks = [n for n in roles if n.startswith("callbacks.")]
    assert callbacks and all(roles[n] != "model" for n in callbacks), {n: roles[n] for n in callbacks}


def test_convert_loads_in_transformers_with_the_same_logits(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path / "hf"
    result = run_cli("convert", str(CKPT), str(out), "--to", "hf", "--hf-config", str(SAMPLE / "hf_config"))
    assert result.code == 0, result.err
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(SAMPLE / "hf_config"))).float()
    reference.load_state_dict(load_file(str(SAMPLE / "reference.safetensors")))
    tokens = torch.arange(24).reshape(2, 12)
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, reference(tokens).logits)


def test_the_checkpoint_folder_is_a_save_root():
    """ModelCheckpoint's folder (``epoch=0-step=2.ckpt``, ``epoch=1-step=4.ckpt``, ``last.ckpt``) was
    "not a checkpoint ckptscope can read"; it is a save root of one file per step, the newest opened."""
    root = SAMPLE / "ckpts"
    data = json.loads(run_cli("inspect", "--json", str(root)).out)
    assert [i["iteration"] for i in data["iterations"]] == [4, 2]
    assert data["path"].endswith("epoch=1-step=4.ckpt")
    assert run_cli("check", str(root)).code == 0
    newest = run_cli("diff", "--json", str(root), str(SAMPLE / "reference.safetensors"))
    assert newest.code == 0, newest.out[-800:]
    steps = run_cli("diff", "--json", str(root), str(root), "--iteration", "2", "--iteration-b", "4")
    assert steps.code == 1 and json.loads(steps.out)["summary"]["different"] > 0
