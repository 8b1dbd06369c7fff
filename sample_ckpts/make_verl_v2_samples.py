#!/usr/bin/env python
"""Write verl's Megatron checkpoint "layout schema v2" the way verl's manager does, with the real writers.

    python sample_ckpts/make_verl_v2_samples.py [OUT_DIR]      # default: a temporary dir, printed

verl itself is not installed (it needs CUDA, Ray and mbridge), so the layout is written here exactly
as ``MegatronCheckpointManager.save_checkpoint`` (verl-project/verl ``1dda039b``, 2026-08-22) lays
it out, read from ``verl/utils/checkpoint/megatron_checkpoint_manager.py`` (``save_checkpoint``,
``_build_checkpoint_manifest``, ``_write_checkpoint_manifest``, ``_save_transformer_config``,
``get_rng_state``), ``verl/utils/megatron_utils.py`` (``get_*_checkpoint_path``: every path helper
creates its directory, so ``model/dist_ckpt/`` and ``model/huggingface/`` both exist even when only
one is filled), ``verl/utils/megatron/dist_checkpointing.py`` (``save_dist_checkpointing``:
``TorchDistSaveShardedStrategy`` in a ``FullyParallelSaveStrategyWrapper``, ``content_metadata``)
and ``docs/advance/checkpoint.rst``; mbridge's HF writer from ISEEKYAN/mbridge
``mbridge/core/safetensor_io.py`` (``save_hf_weight``: a model without an index gets one
``model.safetensors`` by ``safetensors.torch.save_file``, no ``format`` metadata)::

    <run>/latest_checkpointed_iteration.txt            # by verl's trainer, after the save
    <run>/global_step_2/actor/
      model/dist_ckpt/        megatron-core dist_checkpointing.save({"model": sharded_state_dict})
      model/huggingface/      mbridge: config/tokenizer (save_pretrained) + model.safetensors
      optimizer/dist_ckpt/    {"optimizer": ..., "lr_scheduler": {...}}
      extra/dist_ckpt/        {"rng_state": ShardedObject("rng_state", [...], (pp, tp), (pp_rank, tp_rank))}
      transformer_config.json rank 0, the TransformerConfig fields that JSON can hold
      ckpt_contents.json      rank 0, LAST, written to .tmp then os.replace'd (the completeness marker)

The model is ``hf_llama_gqa`` of make_mcore_pair_samples (transformers ``save_pretrained``) moved into
a TP=2 megatron-core GPTModel on 2 gloo ranks; the generator asserts the GPTModel's logits equal
transformers' before saving, so both runs hold that HF model exactly:

* ``verl_v2_dist/``: ``use_dist_checkpointing=True``, no bridge: weights in ``model/dist_ckpt/``
  (``model/huggingface/`` is the empty dir the manifest's path helper creates).
* ``verl_v2_mbridge/``: ``use_mbridge`` (the default), ``use_dist_checkpointing=False``: weights as
  HF safetensors in ``model/huggingface/``, ``model/dist_ckpt/`` empty.

Optimizer state is ``torch.optim.Adam`` (lr 0, so the weights stay the HF model's) keyed onto the
model's sharded tensors with megatron-core's ``optim_state_to_sharding_state``, as
make_dist_samples does for Megatron's non-distributed optimizer. megatron-core's ``torch.cuda``
calls on CPU are stubbed in the spawned ranks only (FORMATS.md §11).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from make_dist_samples import _init_gloo, _spawn, _stub_cuda
from make_verl_samples import _tokenizer

STEP = 2
TP = 2
ARCH = "llama_gqa"
MANIFEST = "ckpt_contents.json"
RUNS = ("verl_v2_dist", "verl_v2_mbridge")


def actor_dir(run: Path) -> Path:
    return Path(run) / f"global_step_{STEP}" / "actor"


def _paths(actor: Path) -> dict[str, Path]:
    """verl's path helpers; each creates its directory (``local_mkdir_safe``)."""
    paths = {"model_dist": actor / "model" / "dist_ckpt", "hf": actor / "model" / "huggingface",
             "optim_dist": actor / "optimizer" / "dist_ckpt", "extra_dist": actor / "extra" / "dist_ckpt"}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    return paths


def _save_dist(state: dict, path: Path, content_metadata: dict) -> None:
    """verl's ``save_dist_checkpointing`` (synchronous)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    strategy = FullyParallelSaveStrategyWrapper(TorchDistSaveShardedStrategy(backend="torch_dist", version=1),
                                                parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist_checkpointing.save(state, str(path), sharded_strategy=strategy, async_sharded_save=False,
                            validate_access_integrity=True, content_metadata=content_metadata)
    dist.barrier()


def _rng_state():
    """``get_rng_state(use_dist_ckpt=True)``: one ShardedObject per (pp, tp) rank, DP rank as replica."""
    import random

    import numpy as np
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(),
             "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
    return ShardedObject("rng_state", [state],
                         (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size()),
                         (mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank()),
                         replica_id=mpu.get_data_parallel_rank(with_context_parallel=True))


def _lr_scheduler_state() -> dict:
    """Megatron ``OptimizerParamScheduler.state_dict()`` keys (plain numbers: common.pt)."""
    return {"max_lr": 1e-6, "lr_warmup_steps": 0, "num_steps": STEP, "lr_decay_style": "constant",
            "lr_decay_steps": 100, "min_lr": 0.0, "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
            "wd_incr_steps": 100}


def _transformer_config_json(model) -> dict:
    """``_save_transformer_config``: the dataclass fields, dtypes as strings, callables dropped."""
    from dataclasses import fields

    import torch

    out = {}
    for f in fields(model.config):
        value = getattr(model.config, f.name, None)
        if callable(value) and not isinstance(value, torch.dtype):
            continue
        if isinstance(value, (str, int, float, bool, type(None))):
            out[f.name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
            out[f.name] = list(value)
        else:
            out[f.name] = str(value)
    return out


def _manifest(actor: Path, *, dist_model: bool, world_size: int) -> dict:
    """``_build_checkpoint_manifest`` for save_contents ``["model", "optimizer", "extra"]``."""
    hf = {"path": "model/huggingface", "format": "huggingface"}
    contents: dict = {}
    if dist_model:
        contents["model"] = {"path": "model/dist_ckpt", "format": "megatron_dist_checkpoint",
                             "backend": "dist_checkpointing"}
    else:
        contents["model"] = {**hf, "backend": "mbridge"}
    contents["optimizer"] = {"path": "optimizer/dist_ckpt", "format": "megatron_dist_checkpoint"}
    contents["lr_scheduler"] = {"path": "optimizer/dist_ckpt", "format": "megatron_dist_checkpoint",
                                "key": "lr_scheduler"}
    contents["rng_state"] = {"path": "extra/dist_ckpt", "format": "megatron_dist_checkpoint", "key": "rng_state"}
    contents["transformer_config"] = {"path": "transformer_config.json", "format": "json"}
    directories = {}
    if not dist_model:
        contents["hf_config"] = {**hf, "note": "config.json, tokenizer, and optional generation_config.json"}
        directories["model/huggingface"] = "HuggingFace-format artifacts written via mbridge."
    else:
        directories["model/dist_ckpt"] = "Megatron dist_checkpointing shards for model weights."
    directories["optimizer/dist_ckpt"] = "Megatron dist_checkpointing shards for the optimizer state."
    directories["extra/dist_ckpt"] = "Megatron dist_checkpointing shards for extra state (rng_state)."
    return {"schema_version": 2, "framework": "megatron", "role": actor.name, "arch": "LlamaForCausalLM",
            "global_step": STEP, "world_size": world_size,
            "backend": {"has_bridge": not dist_model, "use_dist_checkpointing": dist_model, "peft": False},
            "save_contents": ["model", "optimizer", "extra"], "contents": contents, "directories": directories,
            "saved_any_dist_ckpt": True}


def _write_manifest(actor: Path, manifest: dict) -> None:
    """``_write_checkpoint_manifest``: rank 0, last, atomically."""
    target = actor / MANIFEST
    tmp = Path(str(target) + ".tmp")
    with open(tmp, "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)


def _save_actor(run: Path, model, optimizer, hf_model, *, dist_model: bool) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    rank = dist.get_rank()
    actor = actor_dir(run)
    if rank == 0:
        shutil.rmtree(run, ignore_errors=True)
        actor.mkdir(parents=True)
    dist.barrier()
    paths = _paths(actor)
    content_metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    metadata = {**content_metadata, "dp_cp_group": mpu.get_data_parallel_group(with_context_parallel=True)}
    sharded = {"model": model.sharded_state_dict(metadata=metadata)}
    optim_state = optimizer.state_dict()
    optim_state_to_sharding_state(optim_state, get_param_id_to_sharded_param_map(sharded["model"], model.parameters()),
                                  exclude_keys=("step",))
    # 1. the dist_checkpointing trees, model -> optimizer -> extra (empty state dicts are skipped)
    if dist_model:
        _save_dist(sharded, paths["model_dist"], content_metadata)
    _save_dist({"optimizer": optim_state, "lr_scheduler": _lr_scheduler_state()}, paths["optim_dist"],
               content_metadata)
    _save_dist({"rng_state": _rng_state()}, paths["extra_dist"], content_metadata)
    if rank == 0 and not dist_model:
        # 2. HF config + tokenizer (rank 0), 3. HF weights through mbridge
        hf_model.config.save_pretrained(paths["hf"])
        _tokenizer(hf_model.config.vocab_size).save_pretrained(paths["hf"])
        from transformers import GenerationConfig  # verl: when config.name_or_path has one

        GenerationConfig.from_pretrained(hf_model.config.name_or_path).save_pretrained(paths["hf"])
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in hf_model.state_dict().items()}, paths["hf"] / "model.safetensors")
    dist.barrier()
    if rank == 0:
        # 4. transformer_config.json, 5. the manifest last; then the trainer's tracker
        (actor / "transformer_config.json").write_text(json.dumps(_transformer_config_json(model), indent=2))
        _write_manifest(actor, _manifest(actor, dist_model=dist_model, world_size=dist.get_world_size()))
        (run / "latest_checkpointed_iteration.txt").write_text(str(STEP))
    dist.barrier()


def _rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    import torch
    from make_mcore_pair_samples import (
        _assert_logits_match,
        _prepare_megatron,
        convert_and_check,
        load_hf_model,
        megatron_args,
    )
    from transformers import AutoConfig

    hf_dir, out_dir = (Path(p) for p in out.split("|"))
    args = megatron_args(AutoConfig.from_pretrained(str(hf_dir)), tp=world_size)
    _prepare_megatron(world_size)
    model, hf_logits, mc_logits = convert_and_check(hf_dir, args, tp_rank=rank)
    _assert_logits_match(hf_logits, mc_logits, args, f"verl v2 (rank {rank})")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0)
    sum((p.float() ** 2).sum() for p in model.parameters()).backward()
    optimizer.step()
    hf_model = load_hf_model(hf_dir)
    _save_actor(out_dir / RUNS[0], model, optimizer, hf_model, dist_model=True)
    _save_actor(out_dir / RUNS[1], model, optimizer, hf_model, dist_model=False)
    torch.distributed.destroy_process_group()


def write_verl_v2_runs(out: Path) -> dict[str, Path]:
    """Both runs (``verl_v2_dist``, ``verl_v2_mbridge``) and the HF model they hold (``hf_llama_gqa``)."""
    from make_mcore_pair_samples import write_hf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf_dir = out / f"hf_{ARCH}"
    if not (hf_dir / "config.json").exists():
        write_hf(ARCH, out)
    _spawn(_rank, f"{hf_dir}|{out}", world_size=TP)  # type: ignore[arg-type]
    return {"hf": hf_dir, **{name: out / name for name in RUNS}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="verl_v2_"))
    for name, path in write_verl_v2_runs(out).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
