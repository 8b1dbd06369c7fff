#!/usr/bin/env python
"""Write tiny Megatron-LM ``--ckpt-format torch_dcp`` and ``fsdp_dtensor`` save roots.

    python sample_ckpts/make_megatron_dcp_samples.py [OUT_DIR] [--only NAME ...]   # default: sample_ckpts/

Both hold the weights of ``hf_llama_gqa/`` (make_mcore_pair_samples: Llama, hidden 64, 2 layers,
8 query heads in 2 KV groups, SwiGLU 96, vocabulary 250 padded to 256, untied) in a megatron-core
0.16.1 ``GPTModel`` (local spec) whose logits equal transformers' before anything is written, so a
conversion back to HF can be judged against the original bit for bit. Next to the model they carry
Adam state (one ``torch.optim.Adam`` step whose parameter update is undone, so the weights stay
those of ``hf_llama_gqa``), the scheduler, RNG state and the common objects Megatron writes.

What Megatron-LM writes, from its source (NVIDIA/Megatron-LM at d98e8a64dd, 2026-08-22):

* ``megatron/training/checkpointing.py`` ``save_checkpoint``: the iteration dir is
  ``<save>/iter_{iteration:07d}/`` (``get_checkpoint_name``) and, once every rank is done, rank 0
  writes ``<save>/latest_checkpointed_iteration.txt`` with the bare number. For
  ``ckpt_type == GLOBAL and ckpt_format in ['torch_dcp', 'fsdp_dtensor']`` it calls
  ``torch.distributed.checkpoint.save(state_dict=state_dict,
  storage_writer=FileSystemWriter(checkpoint_name))`` (``.metadata`` + ``__<rank>_0.distcp``);
  there is no ``metadata.json`` and no ``common.pt``: ``args``, ``iteration`` ... are DCP bytes
  entries of the same save.
* ``generate_state_dict``: ``args`` (the ``argparse.Namespace``), ``checkpoint_version`` 3.0,
  ``iteration``, ``model`` (``modelI`` per virtual-pipeline chunk) =
  ``model[i].state_dict_for_save_checkpoint()`` for torch / torch_dcp / fsdp_dtensor (not the
  sharded state dict torch_dist uses), ``optimizer`` = ``optimizer.state_dict()`` for torch_dcp
  but ``optimizer.sharded_state_dict(state_dict, metadata={"distrib_optim_sharding_type":
  "fsdp_dtensor", ...})`` for fsdp_dtensor, ``opt_param_scheduler``, ``rerun_state_machine``,
  ``rng_state``; ``save_checkpoint`` adds ``num_floating_point_operations_so_far``.
* ``get_rng_state``: a list of per-DP-rank dicts (``random_rng_state``, ``np_rng_state``,
  ``torch_rng_state``, ``cuda_rng_state``, ``rng_tracker_states``); for fsdp_dtensor it is
  wrapped as ``{f"({pp_rank}, {tp_rank})": rng_state_list}``.
* torch_dcp (``--use-torch-fsdp2``, ``megatron/core/distributed/torch_fully_sharded_data_parallel.py``):
  the model chunk is a ``_BaseDataParallel`` wrapper whose ``state_dict_for_save_checkpoint``
  delegates to the GPTModel (``data_parallel_base.py``), so the DCP keys are
  ``model.decoder.layers.{i}.self_attention.linear_qkv.weight`` ... (per layer, stage-local index,
  fused QKV and ``[gate; up]`` fc1 as in any mcore state dict). The optimizer is a plain
  ``FP32Optimizer`` / ``ChainedOptimizer`` of one, whose ``state_dict()`` is torch's
  (``megatron/core/optimizer/optimizer.py``): ``optimizer.state.<param index>.exp_avg`` ... and
  ``optimizer.param_groups`` (a bytes entry).
* fsdp_dtensor (Megatron-FSDP, ``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py``): the
  adapter's ``state_dict_for_save_checkpoint`` is its ``state_dict``, i.e. ``MegatronFSDP``'s, whose
  child is the (``Float16Module``-wrapped) GPTModel: model keys are ``module.<mcore name>``, on disk
  ``model.module.decoder.layers.{i}.…``. ``preprocess_fsdp_dtensor_state_dict`` then, with
  ``args.swiglu``, runs ``handle_swiglu_in_state_dict``
  (``megatron/core/transformer/fsdp_dtensor_checkpoint.py``): every ``mlp.linear_fc1.weight`` (and
  bias, expert and shared-expert fc1) becomes ``…linear_fc1.weight_w`` (gate) and ``…weight_v``
  (up), in the model and in the optimizer state. The optimizer
  (``DistributedOptimizer.sharded_param_state_fsdp_dtensor``, ``distrib_optimizer.py``) is
  ``{"state": {<param name>: {"exp_avg", "exp_avg_sq", ...}}, "param_to_group_meta": {<param
  name>: group without "params"}}`` with ``<param name>`` from ``named_parameters()`` of the
  wrapped chunk: ``module.module.module.<mcore name>`` under bf16 (adapter -> MegatronFSDP ->
  Float16Module -> GPTModel). These are also the defaults of ``tools/checkpoint/checkpoint_inspector.py
  convert-torch-dist-to-fsdp-dtensor`` (``model_weight_prefix="model.module"``,
  ``optimizer_state_prefix="optimizer.state.module.module.module"``,
  ``optimizer_param_to_group_prefix="optimizer.param_to_group_meta.module.module.module"``), so
  DCP keys read ``optimizer.state.module.module.module.decoder.layers.0.mlp.linear_fc1.weight_w.exp_avg``
  (state name LAST, unlike torch_dist). Layers are per layer with the stage-local index
  (``get_global_unique_param_name`` makes optimizer names PP-unique).
* Both formats are told apart only by the run's args (``_get_checkpoint_format`` /
  ``args.ckpt_format``); on disk the ``model.module.`` prefix and the ``_w``/``_v`` suffixes mark
  fsdp_dtensor.

What runs for real here. torch_dcp: 2 gloo ranks (data parallel 2, TP 1), each a megatron-core
0.16.1 ``GPTModel`` wrapped in megatron-core's own ``TorchFullyShardedDataParallel`` (FSDP2
``fully_shard``: every parameter becomes a DTensor sharded over the 2 ranks), torch's Adam over
those DTensors, ``state_dict_for_save_checkpoint()`` and ``optimizer.state_dict()``, and the
collective ``torch.distributed.checkpoint.save`` with its ``FileSystemWriter`` exactly as
``save_checkpoint`` calls it: two ``.distcp`` files, two chunks per tensor. Two CPU-only
substitutions, in the spawned ranks only: make_dist_samples' torch.cuda stubs, and the wrapper's
"cuda" device mesh built as "cpu". fsdp_dtensor: the GPTModel and its
``state_dict_for_save_checkpoint()`` are real (one rank in this process,
``make_mcore_pair_samples.cpu_megatron`` stubs the torch.cuda calls), as are Adam and ``dcp.save``;
Megatron-FSDP itself needs CUDA, so the wrapper prefixes, the SwiGLU split of the model and of
the optimizer moments, ``param_to_group_meta`` and the rng wrapping are written here following
the source above, and the DTensors Megatron-FSDP would shard are whole tensors (DCP writes a
DTensor held entirely by one rank with the same metadata as a plain tensor: one chunk at offset 0).
For both, what is replicated from megatron/training (not installed) is the composition of the
state dict (``generate_state_dict``), the dir names and the tracker.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import make_mcore_pair_samples as pair  # noqa: E402

ITERATION = 3
WORLD = 2
"""Data-parallel ranks of the torch_dcp save (FSDP2 shards every parameter across them)."""
TRACKER = "latest_checkpointed_iteration.txt"
FLOPS = 4.2e9
HF_NAME = "llama_gqa"
FSDP_MODEL_PREFIX = "module."
"""What ``MegatronFSDP.state_dict`` puts before the GPTModel's names (``model.module.`` on disk)."""
FSDP_PARAM_PREFIX = "module.module.module."
"""``named_parameters()`` of adapter -> MegatronFSDP -> Float16Module -> GPTModel, as a bf16/fp16 run
names optimizer state (an fp32 run has no Float16Module: two ``module.``), and the checkpoint_inspector
converter's default. Only optimizer keys carry it; ckptscope reads any number of them."""
SWIGLU_SUFFIXES = (".mlp.linear_fc1.weight", ".mlp.linear_fc1.bias")


def _args(config, ckpt_format: str) -> argparse.Namespace:
    """The run's args: the pair generator's Megatron args plus the checkpoint flags of this format."""
    args = pair.megatron_args(config, tp=1)
    args.ckpt_format = ckpt_format
    args.iteration = ITERATION
    args.save = "/checkpoints/tiny"
    args.use_torch_fsdp2 = ckpt_format == "torch_dcp"
    args.use_megatron_fsdp = ckpt_format == "fsdp_dtensor"
    args.use_distributed_optimizer = ckpt_format == "fsdp_dtensor"
    args.data_parallel_sharding_strategy = "optim_grads_params" if ckpt_format == "fsdp_dtensor" else "no_shard"
    args.no_save_optim = False
    args.no_save_rng = False
    args.lr = 1e-3
    return args


def checked_model(hf_dir: Path, args: argparse.Namespace):
    """A GPTModel holding ``hf_dir``'s weights, whose logits equal transformers' (asserted)."""
    model, hf_logits, mc_logits = pair.convert_and_check(hf_dir, args)
    pair._assert_logits_match(hf_logits, mc_logits, args, str(hf_dir))
    return model


def with_adam_moments(model, args: argparse.Namespace):
    """An Adam over ``model``'s (possibly DTensor) parameters that took one step.

    The step's parameter update is undone, so the optimizer has real moments and the weights stay
    exactly the HF sample's. The gradient is that of ``sum((i + 1) * p**2)``, set directly: any
    gradient gives real moments, and this one needs no forward pass (nor a CUDA RNG tracker)."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    for i, (_, param) in enumerate(model.named_parameters()):
        param.grad = 2 * (i + 1) * param.detach().clone()
    optimizer.step()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(saved[name])
    return optimizer


def _rng_state() -> list[dict]:
    """``get_rng_state``'s list of one rank's states (no CUDA here: no cuda_rng_state entry)."""
    import numpy as np
    import torch

    return [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {}}]


def _scheduler_state(args: argparse.Namespace) -> dict:
    """``OptimizerParamScheduler.state_dict()`` (megatron/core/optimizer_param_scheduler.py)."""
    return {"max_lr": args.lr, "lr_warmup_steps": 0, "num_steps": ITERATION, "lr_decay_style": "cosine",
            "lr_decay_steps": 100, "min_lr": 1e-5, "start_wd": 0.0, "end_wd": 0.0, "wd_incr_style": "constant",
            "wd_incr_steps": 100}


def _common(args: argparse.Namespace) -> dict:
    return {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}


def _split_swiglu(state: dict) -> dict:
    """``handle_swiglu_in_state_dict``: fc1 ``X`` -> ``X_w`` (gate rows) and ``X_v`` (up rows)."""
    import torch

    out = {}
    for key, value in state.items():
        if key.endswith(SWIGLU_SUFFIXES):
            gate, up = torch.chunk(value, 2, dim=0)
            out[f"{key}_w"], out[f"{key}_v"] = gate.clone(), up.clone()
        else:
            out[key] = value
    return out


def torch_dcp_state(model, optimizer, args: argparse.Namespace) -> dict:
    """``generate_state_dict`` for ``--ckpt-format torch_dcp``."""
    return {**_common(args), "model": model.state_dict_for_save_checkpoint(),
            "optimizer": optimizer.state_dict(), "opt_param_scheduler": _scheduler_state(args),
            "rng_state": _rng_state(), "num_floating_point_operations_so_far": FLOPS}


def fsdp_dtensor_state(model, optimizer, args: argparse.Namespace) -> dict:
    """``generate_state_dict`` + ``preprocess_fsdp_dtensor_state_dict`` for ``fsdp_dtensor``."""
    model_sd = {FSDP_MODEL_PREFIX + k: v for k, v in model.state_dict_for_save_checkpoint().items()}
    names = {id(p): FSDP_PARAM_PREFIX + n for n, p in model.named_parameters()}
    state, group_meta = {}, {}
    for group in optimizer.param_groups:
        meta = {k: v for k, v in group.items() if k != "params"}
        for param in group["params"]:
            name = names[id(param)]
            group_meta[name] = meta
            moments = dict(optimizer.state[param])
            if not name.endswith(SWIGLU_SUFFIXES):
                state[name] = moments
                continue
            # handle_swiglu_in_state_dict splits exp_avg / exp_avg_sq like the weight, shares the
            # rest ("step") and leaves param_to_group_meta under the unsplit name.
            halves = {"_w": {}, "_v": {}}
            for key, value in moments.items():
                if key == "step":
                    halves["_w"][key], halves["_v"][key] = value, value.clone()
                else:
                    split = _split_swiglu({name: value})
                    halves["_w"][key], halves["_v"][key] = split[name + "_w"], split[name + "_v"]
            for half, moments_half in halves.items():
                state[name + half] = moments_half
    return {**_common(args), "model": _split_swiglu(model_sd),
            "optimizer": {"state": state, "param_to_group_meta": group_meta},
            "opt_param_scheduler": _scheduler_state(args),
            "rng_state": {"(0, 0)": _rng_state()}, "num_floating_point_operations_so_far": FLOPS}


def _save(state: dict, root: Path) -> Path:
    """``torch.distributed.checkpoint.save(state_dict=..., storage_writer=FileSystemWriter(dir))`` into
    ``root/iter_XXXXXXX`` (collective: every rank calls it), then rank 0 writes the tracker."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    ckpt_dir = root / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # regenerate cleanly, never on top of an old save
        ckpt_dir.mkdir(parents=True)
    dist.barrier()
    dcp.save(state_dict=state, storage_writer=dcp.FileSystemWriter(str(ckpt_dir)))
    dist.barrier()
    if dist.get_rank() == 0:
        (root / TRACKER).write_text(str(ITERATION))
    return root


def _hf_dir(out: Path) -> Path:
    hf_dir = Path(out) / f"hf_{HF_NAME}"
    if not (hf_dir / "config.json").exists():
        pair.write_hf(HF_NAME, Path(out))
    return hf_dir


def _fsdp2(model):
    """megatron-core's own ``TorchFullyShardedDataParallel`` (FSDP2 ``fully_shard`` on every
    TransformerLayer, the embedding, then the root) over the data-parallel group. It builds its
    mesh with device type "cuda"; on this CPU-only machine the mesh is made "cpu" instead, which
    changes where shards live, not what DCP writes."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed import torch_fully_sharded_data_parallel as tfsdp
    from torch.distributed.device_mesh import DeviceMesh

    class _CpuMesh:
        @staticmethod
        def from_group(group, device_type):
            return DeviceMesh.from_group(group, "cpu")

    tfsdp.DeviceMesh = _CpuMesh
    # Megatron-LM's config from args carries --transformer-impl local (the local spec's linears are
    # inside the wrapped TransformerLayers and must not be wrapped again).
    model.config.transformer_impl = "local"
    return tfsdp.TorchFullyShardedDataParallel(model.config, DistributedDataParallelConfig(), model)


def _torch_dcp_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """One data-parallel rank of the torch_dcp save; ``out`` is "<start.pt>|<root>" where start.pt
    holds the args and the checked GPTModel's parameters (so ranks need no transformers)."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from make_dist_samples import _init_gloo, _stub_cuda

    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    start, root = out.split("|")
    loaded = torch.load(start, weights_only=False)  # written by write_torch_dcp just before
    args = loaded["args"]
    pair._prepare_megatron(1)
    model = pair.build_gpt_model(args)
    pair.load_params(model, loaded["params"])
    model = _fsdp2(model)
    optimizer = with_adam_moments(model, args)
    _save(torch_dcp_state(model, optimizer, args), Path(root))
    dist.destroy_process_group()


def write_torch_dcp(out: Path) -> Path:
    """``megatron_torch_dcp/``: a ``--ckpt-format torch_dcp`` save root of hf_llama_gqa's weights,
    written by 2 gloo ranks (data parallel 2) through megatron-core's FSDP2 wrapper."""
    import torch
    from make_dist_samples import _spawn
    from transformers import AutoConfig

    hf_dir = _hf_dir(out)
    args = _args(AutoConfig.from_pretrained(str(hf_dir)), "torch_dcp")
    args.data_parallel_size = WORLD
    pair.ensure_single_rank_world()
    with pair.cpu_megatron():
        params = {name: p.detach().clone() for name, p in checked_model(hf_dir, args).named_parameters()}
    root = Path(out) / "megatron_torch_dcp"
    with tempfile.TemporaryDirectory() as tmp:
        start = Path(tmp) / "start.pt"
        torch.save({"args": args, "params": params}, start)
        _spawn(_torch_dcp_rank, f"{start}|{root}", world_size=WORLD)  # type: ignore[arg-type]
    return root


def write_fsdp_dtensor(out: Path) -> Path:
    """``megatron_fsdp_dtensor/``: a ``--ckpt-format fsdp_dtensor`` save root of the same weights
    (one rank, in this process: Megatron-FSDP itself needs CUDA, its layout is replicated)."""
    from transformers import AutoConfig

    hf_dir = _hf_dir(out)
    args = _args(AutoConfig.from_pretrained(str(hf_dir)), "fsdp_dtensor")
    pair.ensure_single_rank_world()
    with pair.cpu_megatron():
        model = checked_model(hf_dir, args)
        optimizer = with_adam_moments(model, args)
        return _save(fsdp_dtensor_state(model, optimizer, args), Path(out) / "megatron_fsdp_dtensor")


WRITERS = {"megatron_torch_dcp": write_torch_dcp, "megatron_fsdp_dtensor": write_fsdp_dtensor}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=str(HERE))
    parser.add_argument("--only", nargs="*", choices=sorted(WRITERS))
    ns = parser.parse_args(argv)
    for name in ns.only or WRITERS:
        print(WRITERS[name](Path(ns.out)))


if __name__ == "__main__":
    main()
