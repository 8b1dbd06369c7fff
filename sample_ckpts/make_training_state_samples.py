#!/usr/bin/env python
"""Write tiny training checkpoints that mix model weights with training state, with the real writers.

    python sample_ckpts/make_training_state_samples.py [OUT_DIR] [--only NAME ...]   # default: sample_ckpts/

These are the save roots real trainers leave behind (GitHub issue "Real trainers' checkpoints"):
the model sits next to optimizer moments, fp32 master copies, schedulers, RNG and data-loader
state, sometimes under a wrapper key, and the root is named the trainer's way. Every writer keeps
reference weights of the model OUTSIDE the checkpoint, so tests can tell a correct export from one
that picked up training state.

The model is always the same tiny Llama (``TINY_LLAMA``: hidden 32, 2 layers, 4 query heads in 2
KV groups, SwiGLU 64, vocabulary 128); torchtitan uses its own FFN sizing (96, see below).

* ``megatron_nondist_optim/``: a Megatron-LM torch_dist save root (``latest_checkpointed_iteration.txt``
  + ``iter_0000005/``) of a megatron-core GPTModel (local spec) on 2 gloo ranks, TP=2. The model is
  wrapped in megatron-core's ``DistributedDataParallel`` and trained for 5 iterations (forward,
  backward on random tokens, ``finish_grad_sync``, ``optimizer.step``) by the optimizer from
  megatron-core's ``get_megatron_optimizer`` (``OptimizerConfig(optimizer="adam",
  use_distributed_optimizer=False)``, fp32: ``ChainedOptimizer`` over an ``FP32Optimizer``) and an
  ``OptimizerParamScheduler``. The state dict is then composed exactly as Megatron-LM's
  ``megatron/training/checkpointing.py`` (``save_checkpoint`` -> ``generate_state_dict``) does for
  ``--ckpt-format torch_dist``: ``args``, ``checkpoint_version`` 3.0, ``iteration``, ``model`` =
  ``model.sharded_state_dict(metadata=...)``, ``optimizer`` = ``optimizer.sharded_state_dict(state_dict,
  metadata=...)``, ``opt_param_scheduler``, ``rng_state`` (a ``ShardedObject`` per (pp, tp) rank, as
  ``get_rng_state`` builds it) and ``num_floating_point_operations_so_far``; it is saved with
  ``dist_checkpointing.save(..., content_metadata=...)``, and rank 0 writes the tracker last.
  ``megatron_nondist_optim_no_optim/`` is the SAME trained model saved as with ``--no-save-optim``
  (no ``optimizer``, no ``opt_param_scheduler``).
* ``megatron_bf16_optim/`` (+ ``_no_optim/``): the same with ``bf16=True``: the GPTModel holds bf16
  parameters inside megatron-core's ``Float16Module`` and the optimizer is
  ``Float16OptimizerWithFloat16Params``, so the checkpoint also holds fp32 master weights
  (``optimizer.state.fp32_param.<param key>``) next to ``optimizer.state.exp_avg*.<param key>``, and
  a ``common_step`` in the common state.
* ``megatron_release/``: a root whose tracker says ``release`` and which holds ``release/`` = a copy of
  ``megatron_nondist_optim/iter_0000005/`` (how Megatron's converters and hand-tagged runs name a
  final checkpoint). Written from ``megatron_nondist_optim/`` (generated first if missing).
* ``torchtitan_run/checkpoint/step-2/`` and ``step-4/``: a torchtitan dump folder as torchtitan v0.2.0's
  ``CheckpointManager.save`` writes it: ``dcp.save(self._flattened_model_states_sd())``, i.e. the
  model's entries FLATTENED to the top level (``ModelWrapper`` = ``get_model_state_dict``) next to
  ``optimizer`` (``OptimizersContainer.state_dict()`` = ``get_optimizer_state_dict(...,
  StateDictOptions(flatten_optimizer_state_dict=True))``: ``optimizer.state.<fqn>.exp_avg``,
  ``optimizer.param_groups.<fqn>.lr``, ...), ``lr_scheduler`` (``LambdaLR.state_dict()`` of the first
  scheduler), ``dataloader`` (``{"dp_rank_<r>": pickle.dumps(loader state), "world_size": 2}``) and
  ``train_state`` (the v0.2.0 ``Trainer.state_dict()``: ``{"step": int, "ntokens_seen": int}``,
  plain ints, so DCP stores them as bytes entries, not tensors). 2 gloo ranks, FSDP2 ``fully_shard``
  per block then the root (torchtitan's ``apply_fsdp``), AdamW + warmup ``LambdaLR``, 4 steps,
  saved after steps 2 and 4. torchtitan itself is not installed (it would pull its own torch): the
  model is torchtitan v0.2.0's llama3 ``Transformer`` re-typed here (module names, RoPE with complex
  ``freqs_cis`` as a non-persistent buffer, ``FeedForward`` sizing ``multiple_of``), the Stateful
  wrappers are reduced to what their ``state_dict()`` returns, and the data loader state is a
  stand-in dict (torchdata is not installed); ``dcp.save`` and the torch calls are the real ones.
  ``freqs_cis_persistent=True`` writes the torchtitan of July-August 2025 instead (complex64
  ``freqs_cis`` saved at the top level).
* ``dcp_model_optim/``: plain ``torch.distributed.checkpoint.save({"model": model_sd, "optim": optim_sd})``
  with ``get_state_dict(model, optimizer)`` of a transformers ``LlamaForCausalLM`` under FSDP2
  ``fully_shard`` on 2 gloo ranks after one AdamW step. The DCP keys are therefore
  ``model.model.embed_tokens.weight`` ... and ``optim.state.model.embed_tokens.weight.exp_avg`` ...;
  ``dcp_model_optim_hf_config/config.json`` is the model's config.

References, next to each checkpoint and never inside it:

* ``<name>_ref/``: an HF model dir (transformers ``save_pretrained``) holding exactly the model weights
  of the checkpoint in HF names (torchtitan: ``torchtitan_run_ref/step-<N>/``, and
  ``step-<N>_titan.safetensors`` with the torchtitan names). For Megatron the HF weights come from the
  trained GPTModel through the inverse of ``make_mcore_pair_samples.hf_to_mcore`` (grouped QKV, [gate;
  up], vocab padding trimmed); for torchtitan through torchtitan's ``Llama3StateDictAdapter.to_hf``
  (RoPE row permutation of wq/wk). Before anything is written the generator checks the references:
  mapped back, they equal the stored shards bitwise (Megatron), and transformers' logits with the
  reference weights equal the trainer's own model's logits (fp32 Megatron and torchtitan).
* ``<name>_ref.json``: ``num_params`` (parameters of the model as stored: Megatron counts its padded
  vocabulary rows), ``hf_num_params``, iteration(s), parallel layout, and whether logits were checked.
* ``<name>_ref_logits.safetensors`` (Megatron, torchtitan last step): ``tokens`` and the trainer's own
  model's ``logits`` over the true vocabulary, for tests that load an export with transformers.

megatron-core touches ``torch.cuda`` on CPU (FORMATS.md §11), and its optimizer and DDP code create
scratch tensors with ``device="cuda"`` and test ``param.type() == "torch.cuda.FloatTensor"``. In the
spawned Megatron ranks only, ``make_dist_samples._stub_cuda`` plus ``_cpu_as_cuda()`` (a
``TorchFunctionMode`` that puts ``device="cuda"`` factories on the CPU, makes ``Tensor.cuda()`` a no-op
and spells ``Tensor.type()`` the CUDA way) let the real megatron-core code run on CPU tensors. None of
this changes what is written: the files hold CPU tensors, as any torch_dist save does.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from make_dist_samples import _init_gloo, _spawn, _stub_cuda  # noqa: E402

TINY_LLAMA = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "vocab_size": 128}
SEED = 1234
WORLD = 2
TRACKER = "latest_checkpointed_iteration.txt"

MEGATRON_ITERATION = 5
MEGATRON_MICRO_BATCH = 2
MEGATRON_SEQ = 16
MEGATRON_LR = 1e-3
MEGATRON_VARIANTS = {"megatron_nondist_optim": False, "megatron_bf16_optim": True}  # name -> bf16

TITAN_STEPS = (2, 4)
TITAN_BATCH = 2
TITAN_SEQ = 16
# torchtitan's TransformerModelArgs for this tiny llama3 (dim 32, 2 layers, 4 heads / 2 KV heads).
TITAN_ARGS = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "multiple_of": 16,
              "ffn_dim_multiplier": None, "norm_eps": 1e-5, "rope_theta": 10000.0, "max_seq_len": 64,
              "rope_scaling": {"scaling_factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}

LOGITS_ATOL = 1e-5


# --- shared helpers ------------------------------------------------------------------------------


def tiny_llama_config():
    """The transformers config of the tiny Llama (fp32, untied, 4 heads in 2 KV groups)."""
    from transformers import LlamaConfig

    config = LlamaConfig(**TINY_LLAMA)
    config.architectures = ["LlamaForCausalLM"]
    return config


def _randomize(named_params, seed: int) -> None:
    """Seeded O(1)-scale values everywhere (norms around 1), so a misplaced row changes the logits."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in named_params:
            if param.dim() == 1:
                value = 1.0 + 0.2 * torch.randn(param.shape, generator=gen)
            else:
                value = torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5
            param.copy_(value.to(param.dtype))


def random_tiny_llama(seed: int = SEED):
    """A transformers LlamaForCausalLM (eager attention, fp32) with seeded random weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_llama_config(), attn_implementation="eager").float()
    _randomize(sorted(model.named_parameters()), seed)
    return model


def _quiet() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def _save_hf_reference(config, state: dict, target: Path, dtype) -> None:
    """``state`` (HF names) through transformers' own ``save_pretrained`` into ``target``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(dtype)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name].to(dtype)), name
    if target.exists():
        shutil.rmtree(target)
    model.save_pretrained(str(target))


def _hf_logits(config, state: dict, tokens):
    """transformers logits (fp32, eager) of ``state`` on ``tokens``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


# --- Megatron-Core on CPU ---------------------------------------------------------------------------


def _cpu_as_cuda():
    """A TorchFunctionMode under which megatron-core's CUDA-only spellings run on CPU tensors.

    ``torch.tensor(..., device="cuda")`` & co. land on the CPU, ``Tensor.cuda()`` returns the tensor,
    and ``Tensor.type()`` (no argument) answers ``torch.cuda.FloatTensor`` for a CPU float tensor, which
    is what ``Float16OptimizerWithFloat16Params`` and ``clip_grads`` test for.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    def is_cuda(device) -> bool:
        if isinstance(device, torch.device):
            return device.type == "cuda"
        return (isinstance(device, str) and device.startswith("cuda")) or isinstance(device, int)

    class CpuAsCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if "device" in kwargs and is_cuda(kwargs["device"]):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
            return func(*args, **kwargs)

    return CpuAsCuda()


def _pair():
    import make_mcore_pair_samples

    return make_mcore_pair_samples


def megatron_training_args(tp: int, bf16: bool) -> argparse.Namespace:
    """Megatron-LM ``args`` of the run (model part from make_mcore_pair_samples.megatron_args)."""
    import torch

    args = _pair().megatron_args(tiny_llama_config(), tp=tp)
    args.bf16 = bf16
    args.params_dtype = torch.bfloat16 if bf16 else torch.float32
    args.accumulate_allreduce_grads_in_fp32 = bf16
    args.seq_length = MEGATRON_SEQ
    args.iteration = MEGATRON_ITERATION
    args.train_iters = 100
    args.micro_batch_size = MEGATRON_MICRO_BATCH
    args.global_batch_size = MEGATRON_MICRO_BATCH  # DP = 1 (both ranks are TP ranks)
    args.data_parallel_size = 1
    args.world_size = tp
    args.optimizer = "adam"
    args.lr = MEGATRON_LR
    args.min_lr = MEGATRON_LR / 10
    args.lr_decay_style = "cosine"
    args.lr_warmup_iters = 2
    args.lr_decay_iters = 100
    args.weight_decay = 0.1
    args.start_weight_decay = 0.1
    args.end_weight_decay = 0.1
    args.weight_decay_incr_style = "constant"
    args.adam_beta1 = 0.9
    args.adam_beta2 = 0.95
    args.adam_eps = 1e-8
    args.clip_grad = 1.0
    args.use_distributed_optimizer = False
    args.use_dist_ckpt = True
    args.no_save_optim = False
    args.no_save_rng = False
    args.data_parallel_random_init = False
    args.save = None
    args.consumed_train_samples = MEGATRON_ITERATION * MEGATRON_MICRO_BATCH
    return args


def mcore_to_hf(shards: list[dict], args: argparse.Namespace) -> dict:
    """Inverse of ``make_mcore_pair_samples.hf_to_mcore``: TP-local GPTModel parameters of every rank
    (``named_parameters()`` names) -> full HF tensors (MAPPING.md §2-§4)."""
    import torch

    def same(name):
        first = shards[0][name]
        for other in shards[1:]:
            assert torch.equal(other[name], first), f"replicated {name} differs between TP ranks"
        return first.clone()

    def cat(name, dim):
        return torch.cat([s[name] for s in shards], dim=dim).clone()

    vocab, hidden = args.vocab_size, args.hidden_size
    groups, d = args.num_query_groups, args.kv_channels
    per_group = args.num_attention_heads // groups
    out = {"model.embed_tokens.weight": cat("embedding.word_embeddings.weight", 0)[:vocab].clone(),
           "model.norm.weight": same("decoder.final_layernorm.weight")}
    if args.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = cat("output_layer.weight", 0)[:vocab].clone()
    for i in range(args.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = same(m + "input_layernorm.weight")
        out[h + "post_attention_layernorm.weight"] = same(m + "pre_mlp_layernorm.weight")
        qkv = cat(m + "self_attention.linear_qkv.weight", 0).reshape(groups, (per_group + 2) * d, hidden)
        out[h + "self_attn.q_proj.weight"] = qkv[:, : per_group * d].reshape(-1, hidden).clone()
        out[h + "self_attn.k_proj.weight"] = qkv[:, per_group * d: (per_group + 1) * d].reshape(-1, hidden).clone()
        out[h + "self_attn.v_proj.weight"] = qkv[:, (per_group + 1) * d:].reshape(-1, hidden).clone()
        out[h + "self_attn.o_proj.weight"] = cat(m + "self_attention.linear_proj.weight", 1)
        halves = [s[m + "mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]  # rank t: [gate_t; up_t]
        out[h + "mlp.gate_proj.weight"] = torch.cat([half[0] for half in halves], dim=0).clone()
        out[h + "mlp.up_proj.weight"] = torch.cat([half[1] for half in halves], dim=0).clone()
        out[h + "mlp.down_proj.weight"] = cat(m + "mlp.linear_fc2.weight", 1)
    return out


def _check_round_trip(hf_state: dict, shards: list[dict], args: argparse.Namespace) -> None:
    """hf_to_mcore(reference) must give back every rank's parameters bitwise (padded vocab rows aside:
    the trained output layer has non-zero padding rows, which HF has no room for)."""
    import torch

    tp = len(shards)
    rows_per_rank = args.padded_vocab_size // tp
    for rank, local in enumerate(shards):
        again = _pair().hf_to_mcore(hf_state, args, tp_rank=rank)
        assert set(again) == set(local), sorted(set(again) ^ set(local))
        for name, value in local.items():
            want, got = value, again[name].to(value.dtype)
            if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
                keep = max(0, min(rows_per_rank, args.vocab_size - rank * rows_per_rank))
                want, got = want[:keep], got[:keep]
            assert torch.equal(want, got), f"rank {rank}: {name} does not map back"


def _stored_numel(dcp_dir: Path) -> int:
    """Elements of every tensor in a DCP / torch_dist dir, from torch's own ``.metadata`` reader."""
    import math

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(dcp_dir)).read_metadata()
    return sum(math.prod(v.size) for v in metadata.state_dict_metadata.values()
               if isinstance(v, TensorStorageMetadata))


def _megatron_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """One TP rank: build, train, save with and without optimizer; rank 0 writes the references.
    ``out`` is ``"<out dir>|<name>"``."""
    _quiet()
    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.module import Float16Module

    pair = _pair()
    out_dir, name = out.split("|")
    out_dir = Path(out_dir)
    bf16 = MEGATRON_VARIANTS[name]
    args = megatron_training_args(world_size, bf16)
    pair._prepare_megatron(world_size)
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)

    hf_start = random_tiny_llama(SEED).state_dict()
    hf_numel = sum(v.numel() for v in hf_start.values())
    with _cpu_as_cuda():
        model = pair.build_gpt_model(args)  # params in args.params_dtype (bf16 with --bf16)
        pair.load_params(model, pair.hf_to_mcore(hf_start, args, tp_rank=rank))
        model.train()
        inner = Float16Module(model.config, model) if bf16 else model  # Megatron-LM's get_model order
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                   use_distributed_optimizer=False)
        ddp_model = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=inner)
        optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                            clip_grad=args.clip_grad, bf16=bf16, params_dtype=args.params_dtype,
                            use_distributed_optimizer=False),
            [ddp_model])
        scheduler = OptimizerParamScheduler(
            optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr,
            lr_warmup_steps=args.lr_warmup_iters * args.global_batch_size,
            lr_decay_steps=args.lr_decay_iters * args.global_batch_size, lr_decay_style=args.lr_decay_style,
            start_wd=args.start_weight_decay, end_wd=args.end_weight_decay,
            wd_incr_steps=args.train_iters * args.global_batch_size, wd_incr_style=args.weight_decay_incr_style)
        seq = MEGATRON_SEQ
        positions = torch.arange(seq).unsqueeze(0).expand(MEGATRON_MICRO_BATCH, seq)
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
        for iteration in range(MEGATRON_ITERATION):  # Megatron-LM's train_step, one micro-batch
            gen = torch.Generator().manual_seed(SEED + iteration)  # the same batch on both TP ranks
            tokens = torch.randint(0, args.vocab_size, (MEGATRON_MICRO_BATCH, seq + 1), generator=gen)
            ddp_model.zero_grad_buffer()
            optimizer.zero_grad()
            loss = ddp_model(input_ids=tokens[:, :-1], position_ids=positions, attention_mask=causal,
                             labels=tokens[:, 1:]).float().mean()
            loss.backward()
            ddp_model.finish_grad_sync()
            update_successful, grad_norm, _ = optimizer.step()
            assert update_successful and grad_norm is not None and np.isfinite(grad_norm), (iteration, grad_norm)
            scheduler.step(increment=args.global_batch_size)
        model.eval()
        logits_tokens = pair.tokens_for(args.vocab_size)
        mcore_logits = pair.mcore_model_logits(model, logits_tokens)[..., : args.vocab_size].float()

        metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
                    "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
        content_metadata = {k: v for k, v in metadata.items() if k != "dp_cp_group"}

        def rng_state():  # megatron.training.checkpointing.get_rng_state for torch_dist (no CUDA here)
            state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                     "torch_rng_state": torch.get_rng_state(),
                     "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
            return ShardedObject("rng_state", [state], (1, world_size), (0, rank),
                                 replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))

        def generate_state_dict(save_optim: bool) -> dict:  # megatron.training.checkpointing
            run_args = argparse.Namespace(**vars(args))
            run_args.no_save_optim = not save_optim
            state = {"args": run_args, "checkpoint_version": 3.0, "iteration": MEGATRON_ITERATION,
                     "model": model.sharded_state_dict(metadata=metadata)}
            if save_optim:
                state["optimizer"] = optimizer.sharded_state_dict(state, metadata=metadata)
                state["opt_param_scheduler"] = scheduler.state_dict()
            state["rng_state"] = rng_state()
            tokens_so_far = MEGATRON_ITERATION * args.global_batch_size * seq  # ~6 N T, as a float
            state["num_floating_point_operations_so_far"] = float(6 * hf_numel * tokens_so_far)
            return state

        with_optim = generate_state_dict(save_optim=True)
        without_optim = generate_state_dict(save_optim=False)
    local_params = {n: p.detach().clone() for n, p in model.named_parameters()}

    for state, root in ((with_optim, out_dir / name), (without_optim, out_dir / f"{name}_no_optim")):
        ckpt_dir = root / f"iter_{MEGATRON_ITERATION:07d}"
        if rank == 0:
            _fresh_dir(ckpt_dir)
            (root / TRACKER).unlink(missing_ok=True)
        dist.barrier()
        dist_checkpointing.save(state, str(ckpt_dir), content_metadata=content_metadata)
        dist.barrier()
        if rank == 0:
            (root / TRACKER).write_text(str(MEGATRON_ITERATION))

    shards = [None] * world_size
    dist.all_gather_object(shards, local_params)
    if rank == 0:
        hf_state = mcore_to_hf(shards, args)
        _check_round_trip(hf_state, shards, args)
        config = tiny_llama_config()
        checked = False
        if not bf16:  # fp32 end to end: transformers must reproduce the trained GPTModel's logits
            hf_logits = _hf_logits(config, hf_state, logits_tokens)
            diff = float((hf_logits - mcore_logits).abs().max())
            assert diff <= LOGITS_ATOL, f"{name}: HF reference vs GPTModel logits differ by {diff:.3g}"
            checked = True
        dtype = torch.bfloat16 if bf16 else torch.float32
        _save_hf_reference(config, hf_state, out_dir / f"{name}_ref", dtype)
        from safetensors.torch import save_file

        save_file({"tokens": logits_tokens.contiguous(), "logits": mcore_logits.contiguous()},
                  str(out_dir / f"{name}_ref_logits.safetensors"), metadata={"format": "pt"})
        num_params = _stored_numel(out_dir / f"{name}_no_optim" / f"iter_{MEGATRON_ITERATION:07d}")
        _write_json(out_dir / f"{name}_ref.json", {
            "num_params": num_params, "hf_num_params": sum(v.numel() for v in hf_state.values()),
            "iteration": MEGATRON_ITERATION, "tensor_model_parallel_size": world_size,
            "data_parallel_size": 1, "bf16": bf16, "logits_checked_fp32": checked,
            "padded_vocab_size": args.padded_vocab_size, "vocab_size": args.vocab_size,
            "no_optim_root": f"{name}_no_optim", "hf_reference": f"{name}_ref"})
    dist.barrier()
    dist.destroy_process_group()


def _write_megatron(name: str, out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _spawn(_megatron_rank, f"{out}|{name}", world_size=WORLD)  # type: ignore[arg-type]
    return out / name


def write_megatron_nondist_optim(out: Path) -> Path:
    """Megatron torch_dist root, fp32 model + non-distributed Adam (also ``*_no_optim/`` and refs)."""
    return _write_megatron("megatron_nondist_optim", out)


def write_megatron_bf16_optim(out: Path) -> Path:
    """Megatron torch_dist root, bf16 model + Float16 optimizer wrapper with fp32 master weights."""
    return _write_megatron("megatron_bf16_optim", out)


def write_megatron_release(out: Path) -> Path:
    """``megatron_release/``: tracker ``release`` + ``release/`` = megatron_nondist_optim's iteration dir."""
    out = Path(out)
    source = out / "megatron_nondist_optim" / f"iter_{MEGATRON_ITERATION:07d}"
    if not (source / "metadata.json").is_file():
        write_megatron_nondist_optim(out)
    root = out / "megatron_release"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copytree(source, root / "release")
    (root / TRACKER).write_text("release")
    return root


# --- torchtitan ------------------------------------------------------------------------------------


def _titan_modules():
    """torchtitan v0.2.0 ``torchtitan/models/llama3/model/model.py``, re-typed (same module names,
    same math). Returned as a dict so the classes exist only where torch is imported."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    def precompute_freqs_cis(dim, end, theta, scaling):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
        factor, low, high = scaling["scaling_factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        orig = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freqs
        high_freq_wavelen, low_freq_wavelen = orig / high, orig / low
        freqs = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * freqs / factor + smooth * freqs
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        freqs = torch.where(medium, smoothed, freqs)
        t = torch.arange(end, device=freqs.device)
        freqs = torch.outer(t, freqs).float()
        return torch.polar(torch.ones_like(freqs), freqs)  # complex64

    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        seqlen = xq_.shape[1]
        freqs = freqs_cis[0:seqlen].view(1, seqlen, 1, xq_.shape[-1])
        xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    def repeat_kv(x, n_rep):
        bs, slen, n_kv_heads, head_dim = x.shape
        if n_rep == 1:
            return x
        return x.unsqueeze(3).expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(
            bs, slen, n_kv_heads * n_rep, head_dim)

    class Attention(nn.Module):
        def __init__(self, a):
            super().__init__()
            self.n_heads, self.n_kv_heads = a["n_heads"], a["n_kv_heads"]
            self.n_rep = self.n_heads // self.n_kv_heads
            self.head_dim = a["dim"] // a["n_heads"]
            self.wq = nn.Linear(a["dim"], self.n_heads * self.head_dim, bias=False)
            self.wk = nn.Linear(a["dim"], self.n_kv_heads * self.head_dim, bias=False)
            self.wv = nn.Linear(a["dim"], self.n_kv_heads * self.head_dim, bias=False)
            self.wo = nn.Linear(self.n_heads * self.head_dim, a["dim"], bias=False)

        def forward(self, x, freqs_cis):
            bs, seqlen, _ = x.shape
            xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
            xq = xq.view(bs, seqlen, -1, self.head_dim)
            xk = xk.view(bs, seqlen, -1, self.head_dim)
            xv = xv.view(bs, seqlen, -1, self.head_dim)
            xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
            keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
            output = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2),
                                                    values.transpose(1, 2), is_causal=True)
            return self.wo(output.transpose(1, 2).contiguous().view(bs, seqlen, -1))

    class FeedForward(nn.Module):
        def __init__(self, dim, hidden_dim, multiple_of, ffn_dim_multiplier):
            super().__init__()
            hidden_dim = int(2 * hidden_dim / 3)
            if ffn_dim_multiplier is not None:
                hidden_dim = int(ffn_dim_multiplier * hidden_dim)
            hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
            self.w1 = nn.Linear(dim, hidden_dim, bias=False)
            self.w2 = nn.Linear(hidden_dim, dim, bias=False)
            self.w3 = nn.Linear(dim, hidden_dim, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class TransformerBlock(nn.Module):
        def __init__(self, layer_id, a):
            super().__init__()
            self.attention = Attention(a)
            self.feed_forward = FeedForward(a["dim"], 4 * a["dim"], a["multiple_of"], a["ffn_dim_multiplier"])
            self.attention_norm = nn.RMSNorm(a["dim"], eps=a["norm_eps"])
            self.ffn_norm = nn.RMSNorm(a["dim"], eps=a["norm_eps"])

        def forward(self, x, freqs_cis):
            h = x + self.attention(self.attention_norm(x), freqs_cis)
            return h + self.feed_forward(self.ffn_norm(h))

    class Transformer(nn.Module):
        def __init__(self, a, freqs_cis_persistent=False):
            super().__init__()
            self.args = a
            self.tok_embeddings = nn.Embedding(a["vocab_size"], a["dim"])
            self.register_buffer("freqs_cis", precompute_freqs_cis(
                a["dim"] // a["n_heads"], a["max_seq_len"], a["rope_theta"], a["rope_scaling"]),
                persistent=freqs_cis_persistent)
            self.layers = nn.ModuleDict({str(i): TransformerBlock(i, a) for i in range(a["n_layers"])})
            self.norm = nn.RMSNorm(a["dim"], eps=a["norm_eps"])
            self.output = nn.Linear(a["dim"], a["vocab_size"], bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h, self.freqs_cis)
            return self.output(self.norm(h))

    return {"Transformer": Transformer}


def titan_hf_config():
    """The transformers config equivalent to ``TITAN_ARGS`` (llama3 RoPE scaling, eps 1e-5, FFN 96)."""
    from transformers import LlamaConfig

    a = TITAN_ARGS
    hidden = int(2 * 4 * a["dim"] / 3)
    hidden = a["multiple_of"] * ((hidden + a["multiple_of"] - 1) // a["multiple_of"])
    scaling = a["rope_scaling"]
    config = LlamaConfig(
        hidden_size=a["dim"], num_hidden_layers=a["n_layers"], num_attention_heads=a["n_heads"],
        num_key_value_heads=a["n_kv_heads"], intermediate_size=hidden, vocab_size=a["vocab_size"],
        rms_norm_eps=a["norm_eps"], max_position_embeddings=a["max_seq_len"], tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": a["rope_theta"], "factor": scaling["scaling_factor"],
                         "low_freq_factor": scaling["low_freq_factor"],
                         "high_freq_factor": scaling["high_freq_factor"],
                         "original_max_position_embeddings": scaling["original_max_position_embeddings"]})
    config.architectures = ["LlamaForCausalLM"]
    return config


def titan_to_hf(state: dict) -> dict:
    """torchtitan v0.2.0 ``Llama3StateDictAdapter.to_hf`` (incl. ``_permute`` of wq / wk)."""
    import re

    a = TITAN_ARGS
    n_heads, n_kv, dim = a["n_heads"], a["n_kv_heads"], a["dim"]
    head_dim = dim // n_heads

    def permute(w, heads, dim1, dim2):
        return w.view(heads, dim1 // heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2).clone()

    names = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight",
             "layers.{}.attention.wq.weight": "model.layers.{}.self_attn.q_proj.weight",
             "layers.{}.attention.wk.weight": "model.layers.{}.self_attn.k_proj.weight",
             "layers.{}.attention.wv.weight": "model.layers.{}.self_attn.v_proj.weight",
             "layers.{}.attention.wo.weight": "model.layers.{}.self_attn.o_proj.weight",
             "layers.{}.feed_forward.w1.weight": "model.layers.{}.mlp.gate_proj.weight",
             "layers.{}.feed_forward.w3.weight": "model.layers.{}.mlp.up_proj.weight",
             "layers.{}.feed_forward.w2.weight": "model.layers.{}.mlp.down_proj.weight",
             "layers.{}.attention_norm.weight": "model.layers.{}.input_layernorm.weight",
             "layers.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight"}
    out = {}
    for key, value in state.items():
        if key == "freqs_cis":
            continue
        if "layers" in key:
            abstract = re.sub(r"(\d+)", "{}", key, count=1)
            layer = re.search(r"\d+", key).group(0)
            if abstract == "layers.{}.attention.wq.weight":
                value = permute(value, n_heads, value.shape[0], value.shape[1])
            if abstract == "layers.{}.attention.wk.weight":
                value = permute(value, n_kv, head_dim * n_kv, dim)
            out[names[abstract].format(layer)] = value.clone()
        else:
            out[names[key]] = value.clone()
    return out


def _linear_warmup_stable_decay(current_step: int, warmup_steps: int, stable_steps: int, decay_steps: int,
                                lr_decay_type: str, min_lr_factor: float) -> float:
    """torchtitan/components/lr_scheduler.py (v0.2.0), linear decay branch."""
    warmup_stable_steps = warmup_steps + stable_steps
    if current_step < warmup_steps:
        current_step += 1
        return float(current_step / (warmup_steps + 1))
    if current_step < warmup_stable_steps:
        return 1.0
    progress = float(current_step - warmup_stable_steps) / max(decay_steps, 1)
    return min_lr_factor + (1 - min_lr_factor) * (1 - progress)


def _titan_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """One FSDP2 rank of the torchtitan run; ``out`` is ``"<out dir>|<persistent freqs_cis 0/1>"``."""
    _quiet()
    _init_gloo(rank, world_size, init_file)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out_dir, persistent = out.split("|")
    out_dir, persistent = Path(out_dir), persistent == "1"
    torch.manual_seed(SEED)
    model = _titan_modules()["Transformer"](TITAN_ARGS, freqs_cis_persistent=persistent)
    _randomize(sorted(model.named_parameters()), SEED + 1)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    for block in model.layers.values():  # torchtitan's apply_fsdp: every block, then the root
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  foreach=False, fused=False)
    lr_lambda = functools.partial(_linear_warmup_stable_decay, warmup_steps=2, stable_steps=0, decay_steps=8,
                                  lr_decay_type="linear", min_lr_factor=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_lambda)

    class ModelWrapper(Stateful):  # torchtitan/components/checkpoint.py
        def __init__(self, m):
            self.model = [m]

        def state_dict(self):
            return {k: v for sd in map(get_model_state_dict, self.model) for k, v in sd.items()}

        def load_state_dict(self, state_dict):  # pragma: no cover - saving only
            raise NotImplementedError

    class OptimizersContainer(Stateful):  # torchtitan/components/optimizer.py
        def __init__(self, m, opt):
            self.model_parts, self.optimizers = [m], [opt]

        def state_dict(self):
            func = functools.partial(get_optimizer_state_dict,
                                     options=StateDictOptions(flatten_optimizer_state_dict=True))
            return {k: v for sd in map(func, self.model_parts, self.optimizers) for k, v in sd.items()}

        def load_state_dict(self, state_dict):  # pragma: no cover
            raise NotImplementedError

    class LRSchedulersContainer(Stateful):  # torchtitan/components/lr_scheduler.py
        def __init__(self, sched):
            self.schedulers = [sched]

        def state_dict(self):
            return self.schedulers[0].state_dict()

        def load_state_dict(self, state_dict):  # pragma: no cover
            raise NotImplementedError

    class ParallelAwareDataloader(Stateful):  # torchtitan/components/dataloader.py
        def __init__(self):
            self.dp_rank, self.dp_world_size = rank, world_size
            self._rank_id = f"dp_rank_{rank}"
            self.batches = 0

        def _loader_state(self):  # stand-in for torchdata StatefulDataLoader.state_dict()
            return {"_snapshot": {"_snapshot_step": self.batches, "_last_yielded_worker_id": 0,
                                  "_main_snapshot": {"_num_yielded": self.batches,
                                                     "_sampler_iter_yielded": self.batches,
                                                     "fetcher_state": {"dataset_iter_state": None,
                                                                       "fetcher_ended": False},
                                                     "dataset_state": {"sample_idx": self.batches * TITAN_BATCH,
                                                                       "token_buffer": []}}},
                    "_steps_since_snapshot": 0}

        def state_dict(self):
            return {self._rank_id: pickle.dumps(self._loader_state()), "world_size": self.dp_world_size}

        def load_state_dict(self, state_dict):  # pragma: no cover
            raise NotImplementedError

    class Trainer(Stateful):  # torchtitan/train.py Trainer.state_dict (v0.2.0)
        def __init__(self):
            self.step, self.ntokens_seen = 0, 0

        def state_dict(self):
            return {"step": self.step, "ntokens_seen": self.ntokens_seen}

        def load_state_dict(self, state_dict):  # pragma: no cover
            raise NotImplementedError

    trainer, dataloader = Trainer(), ParallelAwareDataloader()
    states = {"train_state": trainer, "model": ModelWrapper(model),
              "optimizer": OptimizersContainer(model, optimizer), "dataloader": dataloader,
              "lr_scheduler": LRSchedulersContainer(scheduler)}
    folder = out_dir / "torchtitan_run" / "checkpoint"
    if rank == 0:
        if (out_dir / "torchtitan_run").exists():
            shutil.rmtree(out_dir / "torchtitan_run")
        folder.mkdir(parents=True)
    dist.barrier()
    refs = {}
    for step in range(1, max(TITAN_STEPS) + 1):
        gen = torch.Generator().manual_seed(SEED + 100 * step + rank)  # each DP rank its own batch
        tokens = torch.randint(0, TITAN_ARGS["vocab_size"], (TITAN_BATCH, TITAN_SEQ + 1), generator=gen)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=False)
        optimizer.step()
        scheduler.step()
        trainer.step += 1
        trainer.ntokens_seen += labels.numel()
        dataloader.batches += 1
        if step in TITAN_STEPS:
            # CheckpointManager.save -> _flattened_model_states_sd() -> dcp.save(states, checkpoint_id)
            flattened = {k: v for k, v in states.items() if k != "model"}
            flattened.update(states["model"].state_dict())
            dcp.save(flattened, checkpoint_id=str(folder / f"step-{step}"))
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            refs[step] = {k: v.detach().clone() for k, v in full.items()}
    dist.barrier()
    if rank == 0:
        config = titan_hf_config()
        ref_root = out_dir / "torchtitan_run_ref"
        _fresh_dir(ref_root)
        from safetensors.torch import save_file

        titan_model = _titan_modules()["Transformer"](TITAN_ARGS, freqs_cis_persistent=persistent).eval()
        check_tokens = torch.randint(0, TITAN_ARGS["vocab_size"], (2, 12),
                                     generator=torch.Generator().manual_seed(7))
        for step, state in refs.items():
            params = {k: v for k, v in state.items() if k != "freqs_cis"}
            save_file({k: v.contiguous() for k, v in params.items()},
                      str(ref_root / f"step-{step}_titan.safetensors"), metadata={"format": "pt"})
            hf_state = titan_to_hf(params)
            titan_model.load_state_dict(state, strict=False)
            with torch.no_grad():
                titan_logits = titan_model(check_tokens).float()
            diff = float((_hf_logits(config, hf_state, check_tokens) - titan_logits).abs().max())
            assert diff <= 1e-4, f"torchtitan step {step}: HF reference vs torchtitan logits differ by {diff:.3g}"
            _save_hf_reference(config, hf_state, ref_root / f"step-{step}", torch.float32)
            if step == max(TITAN_STEPS):
                save_file({"tokens": check_tokens, "logits": titan_logits.contiguous()},
                          str(out_dir / "torchtitan_run_ref_logits.safetensors"), metadata={"format": "pt"})
        (out_dir / "torchtitan_run_hf_config").mkdir(exist_ok=True)
        config.save_pretrained(str(out_dir / "torchtitan_run_hf_config"))
        num_params = sum(p.numel() for p in titan_model.parameters())
        _write_json(out_dir / "torchtitan_run_ref.json", {
            "num_params": num_params, "hf_num_params": num_params, "steps": list(TITAN_STEPS),
            "latest_step": max(TITAN_STEPS), "world_size": world_size, "freqs_cis_persistent": persistent,
            "hf_reference": "torchtitan_run_ref/step-<N>",
            "titan_reference": "torchtitan_run_ref/step-<N>_titan.safetensors",
            "hf_config": "torchtitan_run_hf_config", "logits_checked_fp32": True,
            "trained": all(not torch.equal(start[k], refs[max(TITAN_STEPS)][k])
                           for k in start if k != "freqs_cis")})
    dist.barrier()
    dist.destroy_process_group()


def write_torchtitan_run(out: Path, freqs_cis_persistent: bool = False) -> Path:
    """torchtitan dump folder ``torchtitan_run/checkpoint/step-{2,4}/`` (FSDP2, 2 gloo ranks) + refs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _spawn(_titan_rank, f"{out}|{int(freqs_cis_persistent)}", world_size=WORLD)  # type: ignore[arg-type]
    return out / "torchtitan_run"


# --- plain DCP of a transformers model ----------------------------------------------------------------


def _dcp_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    _quiet()
    _init_gloo(rank, world_size, init_file)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out_dir = Path(out)
    torch.manual_seed(SEED)
    model = random_tiny_llama(SEED + 2).train()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    gen = torch.Generator().manual_seed(SEED + rank)
    tokens = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 16), generator=gen)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    target = out_dir / "dcp_model_optim"
    if rank == 0 and target.exists():
        shutil.rmtree(target)
    dist.barrier()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(target))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        config = tiny_llama_config()
        _save_hf_reference(config, full, out_dir / "dcp_model_optim_ref", torch.float32)
        config_dir = out_dir / "dcp_model_optim_hf_config"
        _fresh_dir(config_dir)
        config.save_pretrained(str(config_dir))
        _write_json(out_dir / "dcp_model_optim_ref.json", {
            "num_params": sum(v.numel() for v in full.values()), "hf_num_params": sum(v.numel() for v in full.values()),
            "world_size": world_size, "hf_reference": "dcp_model_optim_ref", "hf_config": "dcp_model_optim_hf_config"})
    dist.barrier()
    dist.destroy_process_group()


def write_dcp_model_optim(out: Path) -> Path:
    """``{"model": ..., "optim": ...}`` DCP of an FSDP2 LlamaForCausalLM (2 gloo ranks) + config + refs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _spawn(_dcp_rank, out)
    return out / "dcp_model_optim"


WRITERS = {
    "megatron_nondist_optim": write_megatron_nondist_optim,
    "megatron_bf16_optim": write_megatron_bf16_optim,
    "megatron_release": write_megatron_release,
    "torchtitan_run": write_torchtitan_run,
    "dcp_model_optim": write_dcp_model_optim,
}


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
