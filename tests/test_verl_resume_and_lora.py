"""verl saves as verl 0.9.1's FSDPCheckpointManager writes them, judged by what verl itself does with them
(a probe ran verl's own manager, its resume and its model merger on 2 gloo ranks):

* a resume opens every rank's ``optim`` and ``extra_state`` file: one missing is a save verl cannot
  resume (``check`` said ok);
* ``fsdp_config.json`` naming another world size than the files: verl's merger and resume fail;
* a PPO step holds ``actor/`` and ``critic/``: both are the save (the critic was never checked);
* LoRA runs (PEFT-wrapped names, ``lora_train_meta.json``; ``save_lora_only`` keeps the adapter alone):
  base weights stay put by design (the timeline flagged each one frozen, exit 1); verl's merger exports
  base weights + ``lora_adapter/`` (convert refused the save);
* a tied model's optimizer has one position for the tied pair (``model.parameters()``), and FSDP1's
  default flat parameters have one per wrapped module: each got a wrong explanation.

Fixtures: sample_ckpts/make_verl_samples.py (FSDP2 / FSDP1 on gloo ranks, PEFT for LoRA).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_verl import actor_of, load_oracle, verl_generators

from ckptscope.formats import open_checkpoint


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return verl_generators().write_verl_run(tmp_path_factory.mktemp("verl_run"))


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory) -> tuple[Path, Path]:
    return verl_generators().write_verl_lora(tmp_path_factory.mktemp("verl_lora"), oracle=True)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_missing_optimizer_or_extra_state_rank_file_fails_check_not_convert(run, tmp_path, cli):
    for kind in ("optim", "extra_state"):
        root = _copy(run, tmp_path / kind)
        (actor_of(root) / f"{kind}_world_size_2_rank_1.pt").unlink()
        result = cli("check", str(root), "--json")
        assert result.code == 1, result.out
        problems = json.loads(result.out)["problems"]
        assert [(p["kind"], p["file"]) for p in problems] == [
            ("missing-state-file", f"global_step_2/actor/{kind}_world_size_2_rank_1.pt")]
        out = tmp_path / f"{kind}-hf"
        converted = cli("convert", str(root), str(out), "--to", "hf")
        assert converted.code == 0, converted.err  # the model is whole: the export goes on, and says what is missing
        assert f"{kind}_world_size_2_rank_1.pt: missing" in converted.err


def test_fsdp_config_naming_another_world_size_fails_check(run, tmp_path, cli):
    root = _copy(run, tmp_path / "ws")
    config = actor_of(root) / "fsdp_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "world_size": 4}))
    result = cli("check", str(root), "--json")
    assert result.code == 1, result.out
    [problem] = json.loads(result.out)["problems"]
    assert problem["kind"] == "config-mismatch" and problem["file"].endswith("fsdp_config.json")
    assert "says world size 4 but the model files are for world size 2" in problem["detail"]


def test_the_critic_beside_the_actor_is_part_of_the_step(run, tmp_path, cli):
    root = _copy(run, tmp_path / "ppo")
    step = root / "global_step_2"
    shutil.copytree(step / "actor", step / "critic")
    whole = cli("check", str(root), "--json")
    assert whole.code == 0, whole.out
    assert json.loads(whole.out)["target"] == "global_step_2"
    (step / "critic" / "model_world_size_2_rank_1.pt").unlink()
    result = cli("check", str(root), "--json")
    assert result.code == 1
    files = {p["file"] for p in json.loads(result.out)["problems"]}
    assert "global_step_2/critic/model_world_size_2_rank_1.pt" in files
    listed = cli("inspect", str(root))
    assert "incomplete" in listed.out + listed.err  # the step is not whole, so no default iteration opens


def test_lora_timeline_does_not_flag_the_frozen_base(lora_runs, cli):
    lora, _ = lora_runs
    result = cli("timeline", str(lora), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["flags"] == []
    assert ("LoRA run: the 21 base weights stay put by design and are not flagged as frozen; only the lora_A/lora_B "
            "tensors (and PEFT's modules_to_save copies) can be") in doc["notes"]
    moved = {t["name"]: t["rel_change"][0] for t in doc["tensors"]}
    assert all(change == 0 for name, change in moved.items() if ".lora_" not in name)
    assert any(change > 0 for name, change in moved.items() if ".lora_B." in name)


def test_lora_only_save_is_said_to_be_an_adapter(lora_runs, tmp_path, cli):
    _, only = lora_runs
    shown = cli("inspect", str(only), "--json")
    assert shown.code == 0, shown.err
    doc = json.loads(shown.out)
    assert any("adapter-only LoRA save" in w for w in doc["metadata"].get("warnings", []) + [shown.err])
    assert "lora_train_meta" in [o["name"] for o in doc["objects"]]
    with open_checkpoint(actor_of(only)) as reader:
        meta = next(o for o in reader.index().objects if o.name == "lora_train_meta")
    assert meta.value == {"r": 4, "lora_alpha": 16, "task_type": "CAUSAL_LM"}
    result = cli("convert", str(only), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "an adapter-only LoRA save (8 lora_A/lora_B tensors" in result.err
    assert "its base weights and adapter are stored together" not in result.err


def test_lora_merge_refuses_lora_alpha_zero(tmp_path, cli):
    """verl's merger writes lora_alpha 0 without lora_train_meta.json: the merge was the base, exit 0."""
    import torch
    from peft import LoraConfig, get_peft_model

    base = verl_generators()._tiny_model()
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    base.save_pretrained(base_dir)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.fill_(0.5)
    peft.save_pretrained(adapter_dir)
    config = adapter_dir / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "lora_alpha": 0}))
    result = cli("lora", "merge", str(adapter_dir), str(base_dir), str(tmp_path / "merged"))
    assert result.code == 2 and "lora_alpha is 0" in result.err and "Traceback" not in result.err
    assert not (tmp_path / "merged").exists()


def test_tied_model_optimizer_positions_skip_the_tied_head(tmp_path, cli):
    """model.parameters() yields the tied pair once: 26 positions for 27 state-dict tensors was read as
    'a buffer, or another model's optimizer'; the embedding's Adam statistics are now there."""
    tied = verl_generators().write_verl_tied(tmp_path / "gen")
    shutil.copytree(tied / "global_step_2", tied / "global_step_1")
    result = cli("timeline", str(tied), "--json")
    assert result.code in (0, 1), result.err
    doc = json.loads(result.out)
    assert doc["optimizer"]["note"] is None, doc["optimizer"]["note"]
    named = {t["name"] for t in doc["optimizer"]["tensors"]}
    assert "model.embed_tokens.weight" in named and "lm_head.weight" not in named


def test_fsdp1_flat_parameters_are_named_as_such(tmp_path, cli):
    _, fsdp1 = verl_generators().write_verl_hsdp_and_fsdp1(tmp_path / "gen")
    shutil.copytree(fsdp1 / "global_step_2", fsdp1 / "global_step_1")
    result = cli("timeline", str(fsdp1), "--json")
    doc = json.loads(result.out)
    said = (doc["optimizer"]["note"] or "") + " ".join(doc["notes"])
    assert "FSDP1 flat parameters (use_orig_params=False)" in said
    assert "another model's optimizer" not in said


def test_lora_only_save_diffs_against_the_adapter_verls_merger_writes(lora_runs, tmp_path, cli):
    """verl's merger writes lora_adapter/adapter_model.safetensors with PEFT's adapter name dropped
    (``lora_A.default.weight`` -> ``lora_A.weight``): the two paired nothing (0 compared, exit 1)."""
    import numpy as np
    from safetensors.numpy import save_file

    _, only = lora_runs
    with open_checkpoint(actor_of(only)) as reader:
        saved = {n.replace(".default.", "."): np.ascontiguousarray(reader.read(n))
                 for n in reader.index().tensors if ".lora_" in n}
    assert len(saved) == 8
    adapter = tmp_path / "lora_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 16,
                                                             "target_modules": ["q_proj", "v_proj"],
                                                             "task_type": "CAUSAL_LM"}))
    save_file(saved, str(adapter / "adapter_model.safetensors"))
    same = cli("diff", str(actor_of(only)), str(adapter), "--json")
    assert same.code == 0, same.out
    doc = json.loads(same.out)
    assert doc["summary"]["equal"] == 8 and doc["identical"]
    first = sorted(saved)[0]
    saved[first] = saved[first] + 1
    save_file(saved, str(adapter / "adapter_model.safetensors"))
    changed = json.loads(cli("diff", str(actor_of(only)), str(adapter), "--json").out)
    assert changed["summary"]["different"] == 1 and changed["summary"]["equal"] == 7


def test_a_lora_training_save_converts_to_base_weights_and_adapter(lora_runs, tmp_path, cli):
    """convert --to hf of a PEFT-wrapped save writes what verl's merger does: the base model under transformers'
    names and lora_adapter/ in PEFT's saved layout. Judged by transformers and PEFT loading them against the run's
    own gathered state dict (values and logits), and by `lora merge` of the two giving the merged model's logits."""
    import numpy as np
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    lora, _ = lora_runs
    oracle = load_oracle(lora)
    out = tmp_path / "hf"
    result = cli("convert", str(lora), str(out), "--to", "hf")
    assert result.code == 0, result.err
    assert "the adapter (8 tensors, r=4, lora_alpha=16, target modules q_proj, v_proj) goes to lora_adapter/" in result.err
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    base = {k.replace("base_model.model.", "").replace(".base_layer.", "."): v for k, v in oracle.items()
            if ".lora_" not in k}
    got = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert set(got) == set(base)
    for name, want in base.items():
        assert got[name].tobytes() == want.tobytes(), name
    peft = PeftModel.from_pretrained(model, out / "lora_adapter")
    loaded = {k: v.detach().numpy() for k, v in peft.state_dict().items()}
    lora_names = [k for k in oracle if ".lora_" in k]
    assert len(lora_names) == 8 and any(np.abs(oracle[k]).sum() > 0 for k in lora_names if ".lora_B." in k)
    for name in lora_names:
        assert loaded[name].tobytes() == oracle[name].tobytes(), name
    trained = get_peft_model(verl_generators()._tiny_model(), LoraConfig(task_type="CAUSAL_LM",
                                                                          **verl_generators().LORA))
    trained.load_state_dict({k: torch.from_numpy(v) for k, v in oracle.items()})
    ids = torch.tensor([[1, 5, 7, 9, 3, 11]])
    with torch.no_grad():
        want_logits = trained(input_ids=ids).logits
        assert torch.equal(peft(input_ids=ids).logits, want_logits)
    merged = tmp_path / "merged"
    assert cli("lora", "merge", str(out / "lora_adapter"), str(out), str(merged)).code == 0
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(merged)(input_ids=ids).logits, want_logits,
                                   rtol=1e-5, atol=1e-5)
    # --dtype casts the adapter too, as verl's merger does
    cast = tmp_path / "bf16"
    assert cli("convert", str(lora), str(cast), "--to", "hf", "--dtype", "bfloat16").code == 0
    with safe_open(str(cast / "lora_adapter" / "adapter_model.safetensors"), "np") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    # --merge-lora: the same merge in one step, nothing left beside it
    one_step = tmp_path / "one_step"
    done = cli("convert", str(lora), str(one_step), "--to", "hf", "--merge-lora")
    assert done.code == 0 and "is merged into the base weights" in done.err, done.err
    assert not (one_step / "lora_adapter").exists() and sorted(p.name for p in tmp_path.iterdir() if
                                                                  "unmerged" in p.name) == []
    from safetensors.numpy import load_file
    merged_tensors, one_step_tensors = load_file(str(merged / "model.safetensors")), load_file(
        str(one_step / "model.safetensors"))
    assert merged_tensors.keys() == one_step_tensors.keys()
    assert all(merged_tensors[k].tobytes() == one_step_tensors[k].tobytes() for k in merged_tensors)
    workers = cli("convert", str(lora), str(tmp_path / "nothing"), "--to", "hf", "--merge-lora", "--workers", "2")
    assert workers.code == 2 and workers.err.count("\n") == 1 and "runs in one process" in workers.err
    plain = cli("convert", str(out), str(tmp_path / "nothing"), "--to", "hf", "--merge-lora")
    assert plain.code == 2 and "not a model wrapped by PEFT" in plain.err and not (tmp_path / "nothing").exists()
    # diff pairs the save's base weights with the export's by the model's names (all 21 were "renamed", 0 compared)
    paired = cli("diff", str(lora), str(out), "--json")
    assert paired.code == 1, paired.err
    doc = json.loads(paired.out)
    assert doc["summary"]["equal"] == 21 and doc["summary"]["only_a"] == 8 and doc["summary"]["renamed"] == 0
    assert any("a model wrapped by PEFT for LoRA training" in note for note in doc["notes"])
    assert all(".lora_" in t["name"] for t in doc["tensors"] if t["status"] == "only_a")
    # `merge` (the verl exporter's verb) writes the same
    again = tmp_path / "merge_cmd"
    assert cli("merge", str(actor_of(lora)), str(again)).code == 0
    assert (again / "lora_adapter" / "adapter_model.safetensors").read_bytes() == \
        (out / "lora_adapter" / "adapter_model.safetensors").read_bytes()


def test_a_lora_training_save_without_its_alpha_or_to_megatron_is_refused(lora_runs, tmp_path, cli):
    """Without lora_train_meta.json the adapter's lora_alpha is unknown (verl's merger writes 0: an adapter that
    loads and does nothing); Megatron-Core has no adapter to load. One line each, nothing written."""
    lora, _ = lora_runs
    to_mcore = cli("convert", str(lora), str(tmp_path / "mcore"), "--to", "mcore")
    assert to_mcore.code == 2 and "converts to HF only" in to_mcore.err and "Traceback" not in to_mcore.err
    assert not (tmp_path / "mcore").exists()
    actor = _copy(actor_of(lora), tmp_path / "actor")
    (actor / "lora_train_meta.json").unlink()
    result = cli("convert", str(actor), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "has no lora_train_meta.json: the adapter's lora_alpha is unknown" in result.err
    assert len(result.err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 0}))
    zero = cli("convert", str(actor), str(tmp_path / "out"), "--to", "hf")
    assert zero.code == 2 and "has lora_alpha 0 in lora_train_meta.json" in zero.err
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    rank = cli("convert", str(actor), str(tmp_path / "out"), "--to", "hf")
    assert rank.code == 2 and "says r=8 but the saved lora_A tensors have rank 4" in rank.err
    # what a probe met: a string r ("says r=4 but ... rank 4"), a file that does not parse ("has no ...")
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": "4", "lora_alpha": 16}))
    text_r = cli("convert", str(actor), str(tmp_path / "out"), "--to", "hf")
    assert text_r.code == 2 and "has r '4', which is no number" in text_r.err
    (actor / "lora_train_meta.json").write_text("{")
    broken = cli("convert", str(actor), str(tmp_path / "out"), "--to", "hf")
    assert broken.code == 2 and "has a lora_train_meta.json that does not parse as JSON" in broken.err
    assert not (tmp_path / "out").exists()


def test_a_lora_save_missing_half_a_pair_is_refused(lora_runs, tmp_path, cli):
    """A module's lora_B gone from every rank file: the adapter was written without it (exit 0), and PEFT loads
    such an adapter with a warning and no update for that module (a probe: logits off by 0.02)."""
    import torch

    lora, _ = lora_runs
    actor = _copy(actor_of(lora), tmp_path / "actor")
    gone = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    for rank_file in sorted(actor.glob("model_world_size_2_rank_*.pt")):
        state = torch.load(rank_file, weights_only=False)
        del state[gone]
        torch.save(state, rank_file)
    result = cli("convert", str(actor), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "q_proj: the LoRA pair is incomplete (lora_B missing)" in result.err, result.err
    assert not (tmp_path / "out").exists()
