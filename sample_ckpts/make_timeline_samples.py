#!/usr/bin/env python
"""Write save roots of a tiny model REALLY trained for a few steps, with known faults planted, for
``ckptscope timeline``.

    python sample_ckpts/make_timeline_samples.py [OUT_DIR]      # default: sample_ckpts/

The point of these roots is that every flag the timeline raises must be explainable: the generator
plants exactly one fault of each kind at a known step and records it in ``<root>_plan.json``, and the
tests check that each flag appears there and nowhere else.

The model is a tiny transformers ``LlamaForCausalLM`` (hidden 32, 2 layers, 4 heads in 2 KV groups,
intermediate 64, vocabulary 128, untied). Training: AdamW (lr 1e-3, weight decay 0.01) on random
tokens drawn from ``[0, VOCAB - 1)`` (the last token id never appears, see the NaN below), one
optimizer step per iteration, CPU, one thread, fixed seeds.

Planted faults (the same in every root):

* frozen layer: every parameter of ``model.layers.1`` has ``requires_grad=False`` from the start, so
  it is never in the optimizer and never changes, while everything else trains;
* NaN: right after optimizer step ``NAN_STEP``, one entry of ``model.embed_tokens.weight`` is set to
  NaN, in the row of the token id that never occurs in the data: the embedding of an absent token
  takes no part in the forward pass and gets a zero gradient, so the NaN does not spread (AdamW's
  decay keeps NaN a NaN); it is in every save from ``NAN_STEP`` on;
* LR spike: optimizer step ``SPIKE_STEP`` runs with ``SPIKE_FACTOR`` x the learning rate (through the
  LR scheduler, so ``_last_lr`` says so), every other step with the base rate.

Roots:

* ``timeline_dcp/checkpoint/step-N/`` (N = 1 .. ``STEPS``, then ``RESUME_STEP``): a torchtitan-style
  dump folder, one ``torch.distributed.checkpoint.save`` per step (no process group, CPU) of the
  model's ``state_dict()`` flattened at the top level (as torchtitan's ``ModelWrapper``), ``optimizer``
  = ``get_optimizer_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=
  True))`` (``optimizer.state.<fqn>.exp_avg_sq`` ...) and ``lr_scheduler`` = ``LambdaLR.state_dict()``.
  Plus one more fault: a bad resume. ``step-RESUME_STEP`` is written by a "resumed" job that loaded
  ``step-RESUME_FROM`` (``dcp.load``) and saved straight away, so its weights equal step
  ``RESUME_FROM``'s, not step ``STEPS``'s.
* ``timeline_fsdp2/checkpoint/step-N/`` (N = 1 .. ``STEPS``): the same training on two gloo ranks with
  FSDP2 (``fully_shard`` per decoder layer and at the root, as torchtitan shards), every rank saving
  with ``dcp.save``: each tensor, weights and Adam state alike, is two row chunks in two ``.distcp``
  files. No resume fault. The same run is also saved as verl saves it, ``timeline_verl/global_step_N/
  actor/model_world_size_2_rank_R.pt`` ... (``write_timeline_verl``).
* ``timeline_hf/checkpoint-N/`` (N = 1 .. ``STEPS``): a transformers ``Trainer`` ``output_dir`` with
  ``save_steps=1``: ``model.safetensors``, ``optimizer.pt`` (indexed by parameter position),
  ``scheduler.pt``, ``trainer_state.json`` ... written by ``Trainer._save_checkpoint`` itself. The
  NaN is planted by a ``TrainerCallback.on_step_end`` (which runs before the save of that step),
  the spike by the ``LambdaLR`` handed to the Trainer.
* ``timeline_megatron/iter_000000N/`` (N = 1 .. ``STEPS``) + ``latest_checkpointed_iteration.txt``: a
  Megatron-LM torch_dist save root of a megatron-core ``GPTModel`` (local spec, the same tiny Llama
  shape, untied, vocabulary 128) on ONE gloo rank (TP=1), wrapped in megatron-core's
  ``DistributedDataParallel``, trained by ``get_megatron_optimizer`` (Adam, fp32, non-distributed)
  with an ``OptimizerParamScheduler`` (constant LR), the state dict composed and saved as
  ``make_training_state_samples`` does (``dist_checkpointing.save`` of ``args``, ``iteration``,
  ``model``, ``opt_param_scheduler``; tracker written last), once per iteration, as with
  ``--no-save-optim``: with a frozen layer megatron-core 0.16.1 refuses to save the optimizer
  (``validate_sharding_integrity``: the layer-stacked ``optimizer.state.exp_avg.decoder.layers.*``
  tensors then cover layer 0 only, "Invalid access pattern"), so this root has no Adam state. Layer 1 is
  frozen (``requires_grad=False`` before DDP, so megatron-core leaves it out of its grad buffers and
  the optimizer); the NaN goes into ``embedding.word_embeddings.weight`` at the row of the absent
  token; the spike multiplies every param group's ``lr`` for step ``SPIKE_STEP`` (the scheduler sets
  it back on its next step). megatron-core needs the CPU stand-ins of ``make_training_state_samples``
  (``_stub_cuda``, ``_cpu_as_cuda``) in the spawned rank only.

Roots without planted faults, for the Adam statistics of optimizer state saved without names:
``timeline_hf_adam`` (``write_timeline_hf_adam``: the Trainer's own optimizer, positional
``optimizer.pt``), ``timeline_distopt_{dp,full,legacy}`` (``write_timeline_distopt``: megatron-core's
distributed optimizer on two DP ranks, saved as torch_dist ``dp_reshardable`` / ``fully_reshardable``
and as ``--ckpt-format torch`` with ``distrib_optim.pt``) and ``timeline_distopt_{tp2,pp2}_{dp,legacy}``
(``write_timeline_distopt_mp``: the same optimizer on two TP ranks, or two pipeline stages, each rank's
buffers holding only its own parameters).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64, "tie_word_embeddings": False}
VOCAB = TINY["vocab_size"]
STEPS = 6
NAN_STEP = 3
NAN_TENSOR = "model.embed_tokens.weight"
NAN_AT = (VOCAB - 1, 0)
SPIKE_STEP = 5
SPIKE_FACTOR = 100.0
FROZEN_PREFIX = "model.layers.1."
LR = 1e-3
RESUME_FROM = 3
RESUME_STEP = 7
SEQ = 16
BATCH = 2


def _plan(root: Path, steps: list[int], **extra) -> dict:
    return {"root": root.name, "steps": steps, "frozen_prefix": FROZEN_PREFIX, "nan_step": NAN_STEP,
            "nan_tensor": NAN_TENSOR, "nan_at": list(NAN_AT), "spike_step": SPIKE_STEP,
            "spike_factor": SPIKE_FACTOR, "lr": LR, **extra}


def _model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).float()
    for name, param in model.named_parameters():
        if name.startswith(FROZEN_PREFIX):
            param.requires_grad_(False)
    return model


def _batch(step: int):
    import torch

    gen = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB - 1, (BATCH, SEQ), generator=gen)  # VOCAB - 1 never occurs


def _lr_factor(step_done: int) -> float:
    """LambdaLR factor for the optimizer step that follows ``step_done`` finished steps."""
    return SPIKE_FACTOR if step_done + 1 == SPIKE_STEP else 1.0


def _train_step(model, optimizer, scheduler, step: int) -> None:
    """One optimizer step on ``_batch(step)``, then the scheduler's step (the LR of the next one)."""
    tokens = _batch(step)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def _plant_nan(model) -> None:
    import torch

    with torch.no_grad():
        dict(model.named_parameters())[NAN_TENSOR][NAN_AT] = float("nan")


def _fresh(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def write_timeline_dcp(out: Path) -> Path:
    """torchtitan-style ``checkpoint/step-N`` DCP saves of a real training run (see module docstring)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    root = Path(out) / "timeline_dcp"
    folder = root / "checkpoint"
    _fresh(folder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    try:
        model = _model()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor)

        def state() -> dict:
            return {**model.state_dict(), "optimizer": get_optimizer_state_dict(model, optimizer, options=options),
                    "lr_scheduler": scheduler.state_dict()}

        for step in range(1, STEPS + 1):
            _train_step(model, optimizer, scheduler, step)
            if step == NAN_STEP:
                _plant_nan(model)
            dcp.save(state(), checkpoint_id=str(folder / f"step-{step}"))
        # The bad resume: a new job loads step-RESUME_FROM and saves at once as step-RESUME_STEP.
        model = _model()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor)
        loaded = state()
        dcp.load(loaded, checkpoint_id=str(folder / f"step-{RESUME_FROM}"))
        model.load_state_dict({k: v for k, v in loaded.items() if k not in ("optimizer", "lr_scheduler")})
        set_optimizer_state_dict(model, optimizer, loaded["optimizer"], options=options)
        scheduler.load_state_dict(loaded["lr_scheduler"])
        dcp.save(state(), checkpoint_id=str(folder / f"step-{RESUME_STEP}"))
    finally:
        torch.set_num_threads(threads)
    plan = _plan(root, list(range(1, STEPS + 1)) + [RESUME_STEP], resume_step=RESUME_STEP, resume_from=RESUME_FROM)
    (Path(out) / "timeline_dcp_plan.json").write_text(json.dumps(plan, indent=1))
    return root


def _fsdp2_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """One of the two ranks of ``write_timeline_fsdp2``: the ``timeline_dcp`` run, sharded by FSDP2."""
    from make_dist_samples import _init_gloo
    from make_verl_samples import _save_like_verl

    _init_gloo(rank, world_size, init_file)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size,))
    model = _model()  # the same seed on every rank: the same initial weights
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # every parameter Shard(0) over the 2 ranks (torchtitan's FSDP)
    # Every parameter, frozen ones included (they get no state), as verl builds its optimizer:
    # build_optimizer(actor_module_fsdp.parameters(), ...) (verl/workers/fsdp_workers.py)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    folder = Path(out) / "timeline_fsdp2" / "checkpoint"
    for step in range(1, STEPS + 1):
        _train_step(model, optimizer, scheduler, step)  # the same batch on both ranks: one batch's gradient
        if step == NAN_STEP:
            embed = dict(model.named_parameters())[NAN_TENSOR]  # a DTensor: plant in the shard holding the row
            local, rows = embed.to_local(), embed.to_local().shape[0]
            first = rank * -(-VOCAB // world_size)
            if first <= NAN_AT[0] < first + rows:
                with torch.no_grad():
                    local[NAN_AT[0] - first, NAN_AT[1]] = float("nan")
        state = {**get_model_state_dict(model),
                 "optimizer": get_optimizer_state_dict(model, optimizer, options=options),
                 "lr_scheduler": scheduler.state_dict()}
        dcp.save(state, checkpoint_id=str(folder / f"step-{step}"))
        # The same state as verl's FSDPCheckpointManager saves it (DTensor values, torch.save per rank)
        _save_like_verl(Path(out) / "timeline_verl" / f"global_step_{step}" / "actor", rank, world_size, model,
                        optimizer, scheduler, 2, model.state_dict(), optimizer.state_dict(), vocab_size=VOCAB)
    if rank == 0:  # verl's trainer writes the tracker after every rank has saved
        (Path(out) / "timeline_verl" / "latest_checkpointed_iteration.txt").write_text(str(STEPS))
    dist.barrier()
    dist.destroy_process_group()


def write_timeline_fsdp2(out: Path) -> Path:
    """``timeline_fsdp2/checkpoint/step-N/``: the ``timeline_dcp`` training (same model, data, faults;
    no resume) on two gloo ranks with FSDP2 (``fully_shard`` per decoder layer and at the root, as
    torchtitan shards), saved by ``dcp.save`` from both ranks after every step, as torchtitan's
    ``CheckpointManager`` does: every tensor, weights and Adam state alike, is two row chunks in two
    ``.distcp`` files (the embedding's NaN row in rank 1's)."""
    from make_dist_samples import _spawn

    root = Path(out) / "timeline_fsdp2"
    _fresh(root / "checkpoint")
    _fresh(Path(out) / "timeline_verl")
    _spawn(_fsdp2_rank, Path(out), world_size=2)
    (Path(out) / "timeline_fsdp2_plan.json").write_text(json.dumps(_plan(root, list(range(1, STEPS + 1))), indent=1))
    return root


def write_timeline_verl(out: Path) -> Path:
    """``timeline_verl/global_step_N/actor/``: the run of ``write_timeline_fsdp2``, saved after every
    step also as verl's ``FSDPCheckpointManager`` saves (make_verl_samples ``_save_like_verl``:
    ``torch.save`` of each rank's ``state_dict()``, DTensor shards, per rank), with verl's tracker."""
    root = Path(out) / "timeline_verl"
    if not (root / "latest_checkpointed_iteration.txt").is_file():
        write_timeline_fsdp2(out)
    return root


def _train_with_trainer(root: Path, steps: int, build, **arguments) -> None:
    """A transformers ``Trainer`` run of ``steps`` optimizer steps on CPU, one thread, saving
    ``root/checkpoint-N`` after every step; ``build()`` gives the ``Trainer`` keyword arguments (the
    model, and optimizers or callbacks), called once the thread count is set."""
    import torch
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    _fresh(root)
    rows = []
    for step in range(1, steps + 1):
        tokens = _batch(step)
        rows += [{"input_ids": t, "attention_mask": torch.ones_like(t), "labels": t.clone()} for t in tokens]
    args = TrainingArguments(output_dir=str(root), max_steps=steps, save_strategy="steps", save_steps=1,
                             per_device_train_batch_size=BATCH, learning_rate=LR, weight_decay=0.01,
                             report_to="none", use_cpu=True, seed=0, data_seed=0, disable_tqdm=True,
                             dataloader_num_workers=0, logging_steps=1000, **arguments)
    threads, verbosity = torch.get_num_threads(), hf_logging.get_verbosity()
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    try:
        Trainer(args=args, train_dataset=rows, **build()).train()
    finally:
        torch.set_num_threads(threads)
        hf_logging.set_verbosity(verbosity)


def write_timeline_hf(out: Path) -> Path:
    """A transformers ``Trainer`` run with ``checkpoint-N`` after every step (see module docstring)."""
    import torch
    from transformers import TrainerCallback

    root = Path(out) / "timeline_hf"

    class PlantNaN(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == NAN_STEP:
                _plant_nan(model)

    def build() -> dict:
        model = _model()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor)
        return {"model": model, "optimizers": (optimizer, scheduler), "callbacks": [PlantNaN()]}

    _train_with_trainer(root, STEPS, build)
    (Path(out) / "timeline_hf_plan.json").write_text(json.dumps(_plan(root, list(range(1, STEPS + 1))), indent=1))
    return root


ADAM_STEPS = 3


def write_timeline_hf_adam(out: Path) -> Path:
    """``timeline_hf_adam/checkpoint-N/`` (N = 1 .. ``ADAM_STEPS``): a transformers ``Trainer`` run
    that builds its own optimizer (``Trainer.create_optimizer``: the weight-decay group, then the
    no-decay group, positions in ``named_parameters()`` order), nothing frozen and nothing planted,
    so that the positional ``optimizer.pt`` can be named (``ops/timeline/optim_hf.py``)."""

    def build() -> dict:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        return {"model": LlamaForCausalLM(LlamaConfig(**TINY)).float()}

    root = Path(out) / "timeline_hf_adam"
    _train_with_trainer(root, ADAM_STEPS, build, lr_scheduler_type="linear")
    return root


MEGATRON_NAN_TENSOR = "embedding.word_embeddings.weight"
MEGATRON_FROZEN_PREFIX = "decoder.layers.1."


class _MegatronRun:
    """One gloo rank of a real megatron-core run of the tiny Llama (local-spec ``GPTModel``, fp32),
    wrapped in megatron-core's ``DistributedDataParallel`` and trained by ``get_megatron_optimizer``
    (Adam) with a constant-LR ``OptimizerParamScheduler``. megatron-core needs the CPU stand-ins of
    ``make_training_state_samples`` (``_stub_cuda``, ``_cpu_as_cuda``) in the spawned rank only."""

    def __init__(self, rank: int, world_size: int, init_file: str, *, tp: int, distributed: bool,
                 frozen_prefix: str | None = None, bucket_size: int | None = None, pp: int = 1,
                 tied: bool = False, qk_layernorm: bool = False, ones_norms: bool = False) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import make_training_state_samples as ts
        from make_dist_samples import _init_gloo, _stub_cuda

        ts._quiet()
        _init_gloo(rank, world_size, init_file)
        _stub_cuda()
        import random

        import numpy as np
        import torch

        self.ts, self.torch = ts, torch
        pair = ts._pair()
        args = ts.megatron_training_args(tp, False)
        args.lr_warmup_iters, args.lr_decay_style, args.lr, args.min_lr = 0, "constant", LR, LR
        args.weight_decay = args.start_weight_decay = args.end_weight_decay = 0.01
        args.use_distributed_optimizer = distributed
        args.pipeline_model_parallel_size, args.world_size = pp, tp * pp
        if tied:  # one embedding; under PP the last stage keeps its output layer equal to it
            args.untie_embeddings_and_output_weights = False
        args.qk_layernorm = qk_layernorm or args.qk_layernorm
        self.args = args
        self.tied, self.ones_norms = tied, ones_norms
        if pp > 1:
            from megatron.core import parallel_state

            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        pair._prepare_megatron(tp)
        torch.manual_seed(ts.SEED)
        random.seed(ts.SEED)
        np.random.seed(ts.SEED)
        torch.set_num_threads(1)
        self.hf_start = ts.random_tiny_llama(ts.SEED).state_dict()
        self.pair, self.rank, self.tp, self.pp = pair, rank, tp, pp
        self.distributed, self.frozen_prefix, self.bucket_size = distributed, frozen_prefix, bucket_size

    def build(self) -> None:
        """Model, DDP, optimizer and scheduler; inside ``ts._cpu_as_cuda()``."""
        torch = self.torch
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        model = self.pair.build_gpt_model(self.args) if self.pp == 1 else self._stage_model()
        self.pair.load_params(model, self._stage_params(model))
        model.train()
        for name, param in model.named_parameters():
            if self.frozen_prefix and name.startswith(self.frozen_prefix):
                param.requires_grad_(False)
        self.model = model
        self.ddp = DistributedDataParallel(config=model.config, module=model, ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=self.bucket_size is not None, bucket_size=self.bucket_size,
            use_distributed_optimizer=self.distributed))
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=LR, min_lr=LR, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
                            adam_eps=1e-8, clip_grad=0.0, bf16=False, params_dtype=torch.float32,
                            use_distributed_optimizer=self.distributed), [self.ddp])
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=LR, max_lr=LR, min_lr=LR, lr_warmup_steps=0, lr_decay_steps=100,
            lr_decay_style="constant", start_wd=0.01, end_wd=0.01, wd_incr_steps=100, wd_incr_style="constant")

    def _stage_model(self):
        """This pipeline stage's GPTModel (``build_gpt_model`` with the stage's layers, embedding on
        the first stage, final norm and output layer on the last)."""
        import dataclasses

        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        args = self.args
        config = dataclasses.replace(self.pair.transformer_config(args), pipeline_model_parallel_size=self.pp,
                                     pipeline_dtype=args.params_dtype)
        return GPTModel(
            config=config, vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization=args.normalization,
                                                            qk_layernorm=args.qk_layernorm),
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
            rotary_base=args.rotary_base, pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage())

    def global_names(self, model) -> dict[str, str]:
        """Parameter name -> its name in the whole model (a later stage's layers are numbered from
        megatron-core's ``get_transformer_layer_offset``)."""
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        offset = get_transformer_layer_offset(model.config) if self.pp > 1 else 0
        out = {}
        for name, _p in model.named_parameters():
            parts = name.split(".")
            if parts[:2] == ["decoder", "layers"]:
                parts[2] = str(int(parts[2]) + offset)
            out[name] = ".".join(parts)
        return out

    def _stage_params(self, model) -> dict:
        """The tiny Llama's weights as this TP rank's and pipeline stage's parameters. With qk_layernorm
        the q/k norms start at 1.0 (megatron-core's and transformers' init); ``ones_norms``: every norm does,
        as at the start of a real run; tied under PP: the last stage's output layer is the embedding."""
        torch = self.torch
        hf = dict(self.hf_start)
        if self.args.qk_layernorm:
            head_dim = self.args.hidden_size // self.args.num_attention_heads
            for key in [k for k in hf if k.endswith("self_attn.q_proj.weight")]:
                hf[key.replace("q_proj.weight", "q_norm.weight")] = torch.ones(head_dim)
                hf[key.replace("q_proj.weight", "k_norm.weight")] = torch.ones(head_dim)
        whole = self.pair.hf_to_mcore(hf, self.args, tp_rank=self.rank % self.tp)
        if self.tied and "output_layer.weight" not in whole:
            whole["output_layer.weight"] = whole["embedding.word_embeddings.weight"].clone()
        if self.ones_norms:
            whole = {k: torch.ones_like(v) if k.endswith(("layernorm.weight", "layer_norm_weight")) else v
                     for k, v in whole.items()}
        return {name: whole[full] for name, full in self.global_names(model).items()}

    def step(self, seed: int, lr_factor: float = 1.0) -> None:
        """One optimizer step on a batch of random tokens from ``seed`` (the last id never occurs); with
        PP > 1 on gradients drawn from ``seed`` instead (``_step_given_gradients``)."""
        torch = self.torch
        if self.pp > 1:
            self._step_given_gradients(seed)
            return
        positions = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
        causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
        tokens = torch.randint(0, VOCAB - 1, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(seed))
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss = self.ddp(input_ids=tokens[:, :-1], position_ids=positions, attention_mask=causal,
                        labels=tokens[:, 1:]).float().mean()
        loss.backward()
        self.ddp.finish_grad_sync()
        if lr_factor != 1.0:
            for group in self.optimizer.param_groups:
                group["lr"] *= lr_factor
        ok, _grad_norm, _ = self.optimizer.step()
        assert ok, seed
        self.scheduler.step(increment=BATCH)

    def _step_given_gradients(self, seed: int) -> None:
        """With PP > 1: one optimizer step on gradients drawn from ``seed`` (per parameter, by its name in
        the whole model) written into megatron-core's grad buffers; the pipeline schedule's forward and
        backward are left out (their p2p transfers need CUDA)."""
        import zlib

        torch = self.torch
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        names = self.global_names(self.model)
        for name, param in self.model.named_parameters():
            # tied: the output layer's gradient is the embedding's (megatron-core all-reduces the two stages')
            drawn = "embedding.word_embeddings.weight" if self.tied and names[name] == "output_layer.weight" else names[name]
            gen = torch.Generator().manual_seed(seed << 32 | zlib.crc32(drawn.encode()))
            param.main_grad.copy_(torch.randn(param.shape, generator=gen) * 1e-2)
        self.ddp.finish_grad_sync()
        ok, _grad_norm, _ = self.optimizer.step()
        assert ok, seed
        self.scheduler.step(increment=BATCH)


def _megatron_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """The one rank of the Megatron run: train ``STEPS`` iterations, save each (see module docstring)."""
    run = _MegatronRun(rank, world_size, init_file, tp=world_size, distributed=False,
                       frozen_prefix=MEGATRON_FROZEN_PREFIX)
    torch = run.torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    root = Path(out)
    with run.ts._cpu_as_cuda():
        run.build()
        metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
        for step in range(1, STEPS + 1):
            run.step(100 + step, SPIKE_FACTOR if step == SPIKE_STEP else 1.0)
            if step == NAN_STEP:
                with torch.no_grad():
                    dict(run.model.named_parameters())[MEGATRON_NAN_TENSOR][NAN_AT] = float("nan")
            state = {"args": run.args, "checkpoint_version": 3.0, "iteration": step,
                     "model": run.model.sharded_state_dict(metadata=metadata)}
            state["opt_param_scheduler"] = run.scheduler.state_dict()  # no "optimizer": see the module docstring
            target = root / f"iter_{step:07d}"
            _fresh(target)
            dist_checkpointing.save(state, str(target), content_metadata=metadata)
            dist.barrier()
            (root / run.ts.TRACKER).write_text(str(step))
    dist.barrier()
    dist.destroy_process_group()


def write_timeline_megatron(out: Path) -> Path:
    """Megatron-LM torch_dist ``iter_*`` saves of a real megatron-core run (see module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_dist_samples import _spawn

    root = Path(out) / "timeline_megatron"
    _fresh(root)
    _spawn(_megatron_rank, root, world_size=1)
    plan = _plan(root, list(range(1, STEPS + 1)), frozen_prefix=MEGATRON_FROZEN_PREFIX,
                 nan_tensor=MEGATRON_NAN_TENSOR)
    (Path(out) / "timeline_megatron_plan.json").write_text(json.dumps(plan, indent=1))
    return root


DISTOPT_STEPS = 2
DISTOPT_BUCKET = 8000
"""Elements per grad bucket (megatron-core closes a bucket once it holds at least this many): the
tiny model's ~27k parameters make several buckets."""
DISTOPT_LAYOUT = "timeline_distopt_layout.json"
"""``DistributedDataParallel``'s grad buffers as megatron-core laid them out: per buffer, each bucket's
(offset, unpadded numel) and each parameter's (start, end, bucket) (``param_index_map``)."""
DISTOPT_ROOTS = {"dp_reshardable": "timeline_distopt_dp", "fully_reshardable": "timeline_distopt_full",
                 "legacy": "timeline_distopt_legacy"}
"""Save flavour -> root name of ``write_timeline_distopt``."""


def _save_distopt_dist(run: _MegatronRun, common: dict, flavour: str, root: Path, step: int, rank: int) -> None:
    """``root/iter_<step>`` as Megatron-LM's torch_dist ``save_checkpoint`` writes it (collective):
    the model's and the distributed optimizer's sharded state dicts with ``distrib_optim_sharding_type
    = flavour``, then the tracker."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    metadata = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
                "distrib_optim_sharding_type": flavour}
    model_sd = run.model.sharded_state_dict(metadata=metadata)
    state = {**common, "model": model_sd, "optimizer": run.optimizer.sharded_state_dict(model_sd, metadata=metadata)}
    target = root / f"iter_{step:07d}"
    if rank == 0:
        _fresh(target)
    dist.barrier()
    dist_checkpointing.save(state, str(target), content_metadata=metadata)
    dist.barrier()
    if rank == 0:
        (root / run.ts.TRACKER).write_text(str(step))


def _distopt_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """One of the DP ranks of the distributed-optimizer run (see ``write_timeline_distopt``)."""
    # TP = 1: the ranks are data-parallel; small buckets (grad reduce overlapped, as Megatron-LM does
    # whenever buckets are used), so the buffers hold several buckets
    run = _MegatronRun(rank, world_size, init_file, tp=1, distributed=True, bucket_size=DISTOPT_BUCKET)
    torch = run.torch
    import torch.distributed as dist

    with run.ts._cpu_as_cuda():
        run.build()
        model, optimizer = run.model, run.optimizer
        if rank == 0:  # megatron-core's own record of where each parameter sits: the tests' oracle
            names = {p: n for n, p in model.named_parameters()}
            layout = [{"buckets": [[b.offset, b.numel_unpadded] for b in buffer.buckets],
                       "params": {names[p]: list(where) for p, where in buffer.param_index_map.items()}}
                      for buffer in run.ddp.buffers]
            (Path(out) / DISTOPT_LAYOUT).write_text(json.dumps(layout, indent=1))
        for step in range(1, DISTOPT_STEPS + 1):
            run.step(100 * step + rank)  # each DP rank its own batch
            common = {"args": run.args, "checkpoint_version": 3.0, "iteration": step,
                      "opt_param_scheduler": run.scheduler.state_dict()}
            for flavour in ("dp_reshardable", "fully_reshardable"):
                _save_distopt_dist(run, common, flavour, Path(out) / DISTOPT_ROOTS[flavour], step, rank)
            # --ckpt-format torch: DP rank 0 torch.saves the model + the optimizer's non-parameter state,
            # and DistributedOptimizer.save_parameter_state (collective) writes distrib_optim.pt.
            root = Path(out) / DISTOPT_ROOTS["legacy"]
            rank_dir = root / f"iter_{step:07d}" / "mp_rank_00"
            if rank == 0:
                rank_dir.mkdir(parents=True, exist_ok=True)
                torch.save({**common, "model": model.state_dict_for_save_checkpoint(),
                            "optimizer": optimizer.state_dict()}, rank_dir / "model_optim_rng.pt")
            dist.barrier()
            optimizer.save_parameter_state(str(rank_dir / "distrib_optim.pt"))
            dist.barrier()
            if rank == 0:
                (root / run.ts.TRACKER).write_text(str(step))
    dist.barrier()
    dist.destroy_process_group()


def write_timeline_distopt(out: Path) -> dict[str, Path]:
    """Megatron-LM save roots of one real megatron-core run with the distributed optimizer.

    A megatron-core ``GPTModel`` (local spec, the tiny Llama shape, fp32) on TWO gloo ranks (TP=1,
    DP=2, so every Adam buffer is split between the ranks), wrapped in megatron-core's
    ``DistributedDataParallel(use_distributed_optimizer=True)`` and trained ``DISTOPT_STEPS`` steps
    by ``get_megatron_optimizer`` (Adam, distributed optimizer, nothing frozen). After every step
    the same state is saved three ways, as Megatron-LM's ``save_checkpoint`` composes them:

    * ``timeline_distopt_dp/iter_N``: torch_dist, ``optimizer.sharded_state_dict(model_sd,
      metadata={"distrib_optim_sharding_type": "dp_reshardable", ...})`` (the default since core
      0.14): flat per-bucket ``optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(...).bucket_idx_0
      .{param,exp_avg,exp_avg_sq}``;
    * ``timeline_distopt_full/iter_N``: the same with ``fully_reshardable`` (``--dist-ckpt-optim-
      fully-reshardable``): ``optimizer.state.exp_avg_sq.<param key>`` in model space;
    * ``timeline_distopt_legacy/iter_N/mp_rank_00/``: ``--ckpt-format torch``: DP rank 0's
      ``torch.save`` of args, model ``state_dict_for_save_checkpoint()``, ``optimizer.state_dict()``
      (no parameter state) and scheduler, plus ``distrib_optim.pt`` from megatron-core's own
      ``save_parameter_state`` (``get_parameter_state_dp_zero``: the buckets gathered and coalesced).

    Grad buckets of ``DISTOPT_BUCKET`` elements (megatron-core pads each bucket's end, which shifts
    every later bucket: megatron-core 0.16.1's own ``fully_reshardable`` save warns "param range
    exceeds unpadded buffer ... can lead to data corruption" here and stores the parameters of every
    bucket after the first shifted by that padding; the two flat saves are right). Rank 0 also
    writes ``DISTOPT_LAYOUT``. Each root has ``latest_checkpointed_iteration.txt``. Needs the CPU stand-ins of
    ``make_training_state_samples`` (FORMATS.md §11) in the spawned ranks only.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_dist_samples import _spawn

    for name in DISTOPT_ROOTS.values():
        _fresh(Path(out) / name)
    _spawn(_distopt_rank, Path(out), world_size=2)
    return {flavour: Path(out) / name for flavour, name in DISTOPT_ROOTS.items()}


DISTOPT_MP = {"tp2": (2, 1), "pp2": (1, 2)}
"""Model-parallel runs of ``write_timeline_distopt_mp``: label -> (TP, PP), one gloo rank each (DP = 1)."""
DISTOPT_VARIANTS = {
    "pp2_tied": (1, 2, {"tied": True}),
    "qkn_warm": (1, 1, {"qk_layernorm": True, "ones_norms": True}),
}
"""Runs of ``write_timeline_distopt_mp`` beyond ``DISTOPT_MP``: label -> (TP, PP, ``_MegatronRun`` options).
``pp2_tied``: tied embeddings over two stages (the last keeps an output layer equal to the embedding).
``qkn_warm``: q/k norms (16 wide) beside the 64-wide layer norms, every norm 1.0 at the start, and step 1
at a warmup rate (``WARMUP_FACTOR`` of the rate) too small to move them: at iteration 1 a norm's masters
fit every norm's place. Test fixtures, not shipped samples."""
WARMUP_FACTOR = 1e-6
DISTOPT_MP_FLAVOURS = ("dp_reshardable", "legacy")


def distopt_mp_root(label: str, flavour: str) -> str:
    """Root name of a ``write_timeline_distopt_mp`` save flavour."""
    return f"timeline_distopt_{label}_{'dp' if flavour == 'dp_reshardable' else flavour}"


def distopt_mp_oracle(label: str, rank: int) -> str:
    """File name of rank ``rank``'s oracle of ``write_timeline_distopt_mp``."""
    return f"timeline_distopt_{label}_oracle.{rank}.pt"


def _distopt_mp_rank(rank: int, world_size: int, out: str, init_file: str, label: str) -> None:
    """One rank of a model-parallel distributed-optimizer run (see ``write_timeline_distopt_mp``)."""
    tp, pp, options = _distopt_run(label)
    run = _MegatronRun(rank, world_size, init_file, tp=tp, pp=pp, distributed=True,
                       bucket_size=DISTOPT_BUCKET if pp == 1 else None, **options)
    torch = run.torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    with run.ts._cpu_as_cuda():
        run.build()
        model, optimizer = run.model, run.optimizer
        names = run.global_names(model)
        oracle = []
        inner = getattr(optimizer, "chained_optimizers", [optimizer])

        def own_state(param):
            (owner,) = [o for o in inner if param in o.model_param_group_index_map]
            return owner._get_main_param_and_optimizer_states(param)

        for step in range(1, DISTOPT_STEPS + 1):
            warm = label == "qkn_warm" and step == 1
            run.step(100 * step, WARMUP_FACTOR if warm else 1.0)  # DP = 1: every rank sees the same batch
            # megatron-core's own per-parameter state of this rank (DP = 1: each shard is the whole local
            # parameter), in the local parameter's shape, by the parameter's name in the whole model
            oracle.append({names[name]: {key: own_state(p)[key].detach().clone().reshape(p.shape)
                                         for key in ("param", "exp_avg_sq")}
                           for name, p in model.named_parameters()})
            common = {"args": run.args, "checkpoint_version": 3.0, "iteration": step,
                      "opt_param_scheduler": run.scheduler.state_dict()}
            flat = Path(out) / distopt_mp_root(label, "dp_reshardable")
            _save_distopt_dist(run, common, "dp_reshardable", flat, step, rank)
            # --ckpt-format torch: every model-parallel rank at DP rank 0 writes its own dir
            # (Megatron-LM's get_checkpoint_name: mp_rank_<tp>, with PP mp_rank_<tp>_<pp>)
            root = Path(out) / distopt_mp_root(label, "legacy")
            rank_dir = root / f"iter_{step:07d}" / (f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else ""))
            rank_dir.mkdir(parents=True, exist_ok=True)
            torch.save({**common, "model": model.state_dict_for_save_checkpoint(),
                        "optimizer": optimizer.state_dict()}, rank_dir / "model_optim_rng.pt")
            optimizer.save_parameter_state(str(rank_dir / "distrib_optim.pt"))
            dist.barrier()
            if rank == 0:
                (root / run.ts.TRACKER).write_text(str(step))
        torch.save(oracle, Path(out) / distopt_mp_oracle(label, rank))
    dist.barrier()
    dist.destroy_process_group()


def _distopt_run(label: str) -> tuple[int, int, dict]:
    if label in DISTOPT_MP:
        return (*DISTOPT_MP[label], {})
    return DISTOPT_VARIANTS[label]


def write_timeline_distopt_mp(out: Path, label: str) -> dict[str, Path]:
    """Megatron-LM save roots of a real megatron-core run with the distributed optimizer on several
    model-parallel ranks (DP = 1, one gloo rank each), so that every rank's flat Adam buffers hold
    only that rank's parameters:

    * ``tp2`` (TP = 2): the run of ``write_timeline_distopt`` with each parameter cut over the two
      ranks as megatron-core cuts it (column-parallel ``linear_qkv`` / ``linear_fc1`` and the
      vocab-parallel embedding and output on their first axis, SwiGLU's ``linear_fc1`` as
      ``[gate_r; up_r]``, row-parallel ``linear_proj`` / ``linear_fc2`` on their second, norms whole on
      both ranks);
    * ``pp2`` (PP = 2): one layer per stage, the embedding on the first, final norm and output layer on
      the last. Its steps run on gradients drawn per parameter (``_MegatronRun._step_given_gradients``:
      the pipeline schedule's p2p transfers need CUDA); the optimizer step and the saves are
      megatron-core's own.

    Saved after each of ``DISTOPT_STEPS`` steps:

    * ``timeline_distopt_<label>_dp/iter_N``: torch_dist ``dp_reshardable``, one
      ``optimizer.distributed.dp_group_idx_<model-parallel rank>...`` set of buckets per rank;
    * ``timeline_distopt_<label>_legacy/iter_N/mp_rank_<tp>[_<pp>]/``: ``--ckpt-format torch``, each
      rank's ``model_optim_rng.pt`` and ``distrib_optim.pt`` (``save_parameter_state``).

    The tests' oracle, ``distopt_mp_oracle(label, rank)`` per rank: a list per step of megatron-core's
    own per-parameter state on that rank (``DistributedOptimizer._get_main_param_and_optimizer_states``:
    the fp32 master ``param`` and ``exp_avg_sq``, in the local parameter's shape, by local-spec
    parameter name in the whole model).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_dist_samples import _spawn

    for flavour in DISTOPT_MP_FLAVOURS:
        _fresh(Path(out) / distopt_mp_root(label, flavour))
    tp, pp, _options = _distopt_run(label)
    _spawn(functools.partial(_distopt_mp_rank, label=label), Path(out), world_size=tp * pp)
    return {flavour: Path(out) / distopt_mp_root(label, flavour) for flavour in DISTOPT_MP_FLAVOURS}


WRITERS = {"timeline_dcp": write_timeline_dcp, "timeline_fsdp2": write_timeline_fsdp2,
           "timeline_verl": write_timeline_verl, "timeline_hf": write_timeline_hf,
           "timeline_hf_adam": write_timeline_hf_adam, "timeline_megatron": write_timeline_megatron,
           "timeline_distopt": write_timeline_distopt,
           **{f"timeline_distopt_{label}": (lambda out, label=label: write_timeline_distopt_mp(out, label))
              for label in DISTOPT_MP}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    for name, writer in WRITERS.items():
        print(f"{name}: {writer(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
