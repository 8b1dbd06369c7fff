#!/usr/bin/env python
"""Write tiny DeepSpeed ZeRO-1/2/3 checkpoints with DeepSpeed itself, plus its own fp32 oracle.

    python sample_ckpts/make_deepspeed_samples.py OUT_DIR

Needs ``deepspeed`` (CPU is enough: ``DS_BUILD_OPS=0 pip install deepspeed``; nothing is compiled,
the client optimizer is torch's AdamW). Not shipped: tests write these into temporary dirs.

For each stage ``S`` in 1, 2, 3, two gloo CPU ranks run ``deepspeed.initialize`` on a tiny
transformers Llama (bf16, ZeRO stage ``S``), take two optimizer steps and call
``engine.save_checkpoint(OUT/zero{S})``, which writes (FORMATS.md §7.1)::

    OUT/zero{S}/latest                       # "global_step2"
    OUT/zero{S}/zero_to_fp32.py
    OUT/zero{S}/global_step2/mp_rank_00_model_states.pt                   # stage 1/2
    OUT/zero{S}/global_step2/zero_pp_rank_{0,1}_mp_rank_00_model_states.pt  # stage 3
    OUT/zero{S}/global_step2/(bf16_)zero_pp_rank_{0,1}_mp_rank_00_optim_states.pt

The model's sizes are odd (hidden 9, 3 heads of 4, 1 KV head, MLP 13, vocab 37), so flat
partitions need padding: stage 1/2 align each group to ``2 * world_size`` and split it in equal
partitions (``layers.1``'s ``v_proj`` and ``embed_tokens`` straddle the rank boundary); stage 3
pads every param to a multiple of the world size. Two param groups, as trainers make them
(matrices with weight decay; embeddings and norms without). ``model.layers.0.input_layernorm.weight``
is frozen (``frozen_param_shapes`` / ``frozen_param_fragments``; bf16 ZeRO-1 records neither, so
DeepSpeed's oracle lacks it).

Oracle: after the save, rank 0 runs DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` on the
save dir and ``torch.save``s the result (plain contiguous tensors) to ``OUT/zero{S}.fp32_oracle.pt``;
``OUT/hf_config/config.json`` is the Llama config (for ``ckptscope merge --hf-config``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this module by name

from make_dist_samples import _init_gloo, _spawn

STAGES = (1, 2, 3)
TAG = "global_step2"
DS_LLAMA = {"hidden_size": 9, "intermediate_size": 13, "num_hidden_layers": 2, "num_attention_heads": 3,
            "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 37, "max_position_embeddings": 32,
            "tie_word_embeddings": False}
FROZEN = "model.layers.0.input_layernorm.weight"


def oracle_path(save_dir: Path) -> Path:
    """DeepSpeed's own consolidated fp32 state dict for ``save_dir`` (kept outside it)."""
    return save_dir.parent / f"{save_dir.name}.fp32_oracle.pt"


def ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def _tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(**DS_LLAMA)).float()
    model.get_parameter(FROZEN).requires_grad_(False)
    return model


def _param_groups(model) -> list[dict]:
    """Two groups, as trainers make them: decayed matrices, then embeddings and norms without decay."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim == 1 or "embed" in name else decay).append(param)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def _train_and_save(stage: int, rank: int, out: Path) -> Path:
    import deepspeed
    import torch
    import torch.distributed as dist

    model = _tiny_llama()
    optimizer = torch.optim.AdamW(_param_groups(model), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(stage),
                                      dist_init_required=False)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):
        ids = torch.randint(0, DS_LLAMA["vocab_size"], (1, 8), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    save_dir = out / f"zero{stage}"
    engine.save_checkpoint(str(save_dir), tag=TAG)
    dist.barrier()
    return save_dir


def _write_oracle(save_dir: Path) -> None:
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(save_dir))
    torch.save({k: v.detach().contiguous().clone() for k, v in state.items()}, oracle_path(save_dir))


def _run_rank(rank: int, world_size: int, out: str, init_file: str, *, stages: tuple[int, ...]) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "DS_ACCELERATOR": "cpu"})
    _init_gloo(rank, world_size, init_file)
    import torch.distributed as dist

    for stage in stages:
        save_dir = _train_and_save(stage, rank, Path(out))
        if rank == 0:
            _write_oracle(save_dir)
        dist.barrier()
    dist.destroy_process_group()


def write_deepspeed_samples(out: Path, stages: tuple[int, ...] = STAGES) -> dict[int, Path]:
    """Write ``out/zero{S}`` for every stage (2 gloo ranks, one spawn) and ``out/hf_config/``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _spawn(functools.partial(_run_rank, stages=tuple(stages)), out, world_size=2)
    from transformers import LlamaConfig

    LlamaConfig(**DS_LLAMA).save_pretrained(out / "hf_config")
    return {stage: out / f"zero{stage}" for stage in stages}


STEPS_DIR = "zero2_steps"


def _run_steps_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """ZeRO-2, one ``engine.save_checkpoint(dir)`` after each of two steps with DeepSpeed's default
    tag (``global_step{N}``), as a training loop saving every step does: ``global_step1/``,
    ``global_step2/`` and ``latest`` naming the second."""
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "DS_ACCELERATOR": "cpu"})
    _init_gloo(rank, world_size, init_file)
    import deepspeed
    import torch
    import torch.distributed as dist

    model = _tiny_llama()
    optimizer = torch.optim.AdamW(_param_groups(model), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(2),
                                      dist_init_required=False)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):
        ids = torch.randint(0, DS_LLAMA["vocab_size"], (1, 8), generator=gen)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        engine.save_checkpoint(str(Path(out) / STEPS_DIR))
        dist.barrier()
    dist.destroy_process_group()


def write_deepspeed_steps(out: Path) -> Path:
    """``out/zero2_steps/global_step{1,2}`` + ``latest``: a two-step ZeRO-2 run saved every step."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _spawn(_run_steps_rank, out, world_size=2)
    return out / STEPS_DIR


PIPELINE_DIR, PIPELINE_FP32_DIR, MOE_DIR = "pipeline_zero1", "pipeline_zero0_fp32", "moe_zero0"
PIPELINE_TP_DIR, PIPELINE_BF16_DIR = "pipeline_tp2", "pipeline_bf16_zero0"
PIPELINE_VARIANTS = {PIPELINE_DIR: {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
                     PIPELINE_FP32_DIR: {"zero_optimization": {"stage": 0}},
                     PIPELINE_BF16_DIR: {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}},
                     PIPELINE_TP_DIR: {"zero_optimization": {"stage": 0}}}
PIPELINE_TIEDSHAPE_DIR, PIPELINE_FROZEN_DIR = "pipeline_bf16_zero0_tiedshape", "pipeline_bf16_zero1_frozen"
PIPELINE_VARIANTS.update({PIPELINE_TIEDSHAPE_DIR: {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}},
                          PIPELINE_FROZEN_DIR: {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}})
PIPELINE_ONE_STAGE_DIR = "pipeline_bf16_zero1_one_stage"
PIPELINE_VARIANTS[PIPELINE_ONE_STAGE_DIR] = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}
PIPELINE_LAYERS = {PIPELINE_TIEDSHAPE_DIR: "tiedshape", PIPELINE_FROZEN_DIR: "frozen"}
"""(``pipeline_bf16_zero1_one_stage``: one stage on both ranks, dp=2, so the tied module is saved twice by it)"""
"""Save dir -> another layer list than ``_pipeline_layers``'s default (a reviewer's cases): ``tiedshape``, a
tied ``Linear(10, 6)`` after a ``Linear(6, 10)`` of the same size transposed (BF16_Optimizer records no shapes);
``frozen``, a frozen ``Linear(6, 6)`` (layer 1, left out of the optimizer) shaped like the tied module."""

PIPELINE_DP2_VARIANTS = {"pipeline_bf16_zero0_dp2": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}},
                         "pipeline_bf16_zero1_acc32_dp2": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                                                           "data_types": {"grad_accum_dtype": "fp32"}}}
"""Run on 4 ranks (pp=2 x dp=2): BF16_Optimizer partitions each stage's masters over its 2 data-parallel
ranks (``bf16_zero_pp_rank_{0,1}_mp_rank_0S``). The second is ZeRO-1 with bf16 params and fp32 gradient
accumulation, which DeepSpeed also runs with its BF16_Optimizer (param shapes recorded, no zero_stage)."""
"""Save dir -> its config beyond the common one. ``pipeline_tp2`` runs on a topology with a model axis
(``PipeModelDataParallelTopology``, pp=1 x tp=2, as Megatron-DeepSpeed builds it): layer files
``layer_0N-model_0{0,1}-model_states.pt`` and one ``mp_rank_0T`` per tensor-parallel rank."""


def pipeline_oracle_path(save_dir: Path) -> Path:
    """What DeepSpeed's engine holds after the save of a pipeline sample, gathered over the stages:
    ``{"fp32": {name: fp32 master}, "module": {name: module weight}}`` under ``PipelineModule``'s names
    (``<layer>.<param>``, ``tied_modules.<key>.<param>``)."""
    return save_dir.parent / f"{save_dir.name}.oracle.pt"


def _pipeline_layers(kind: str = "std"):
    """Six layers in two stages of three; the tied ``Linear`` is the first layer of stage 0 and the last
    of stage 1 (``TiedLayerSpec`` without ``forward_fn``: both stages save it in their layer file). Other
    kinds: see ``PIPELINE_LAYERS``."""
    from torch import nn
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    if kind == "tiedshape":
        return [LayerSpec(nn.Linear, 6, 10, bias=False), TiedLayerSpec("tie", nn.Linear, 10, 6, bias=False),
                LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 6, 10, bias=False), LayerSpec(nn.ReLU),
                TiedLayerSpec("tie", nn.Linear, 10, 6, bias=False)]
    if kind == "frozen":
        return [TiedLayerSpec("tie", nn.Linear, 6, 6, bias=False), LayerSpec(nn.Linear, 6, 6, bias=False),
                LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 6, 6), LayerSpec(nn.LayerNorm, 6),
                TiedLayerSpec("tie", nn.Linear, 6, 6, bias=False)]
    return [TiedLayerSpec("tie", nn.Linear, 6, 6, bias=False), LayerSpec(nn.Linear, 6, 10), LayerSpec(nn.ReLU),
            LayerSpec(nn.Linear, 10, 6), LayerSpec(nn.LayerNorm, 6), TiedLayerSpec("tie", nn.Linear, 6, 6, bias=False)]


def _run_pipeline_dp2_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """``PIPELINE_DP2_VARIANTS`` (see ``_run_pipeline_rank``)."""
    _run_pipeline_rank(rank, world_size, out, init_file, variants=PIPELINE_DP2_VARIANTS)


def _run_pipeline_rank(rank: int, world_size: int, out: str, init_file: str,
                       variants: dict[str, dict] | None = None) -> None:
    """The pipeline samples, each saved by DeepSpeed's engine on 2 ranks (pp=2, dp=1) after 2 steps:

    * ``pipeline_zero1/``: bf16 ZeRO-1: ``layer_0{0..5}-model_states.pt`` (the bf16 module weights, one
      file per layer; ReLU's is empty), ``mp_rank_0{0,1}_model_states.pt`` (one per stage, no ``module``)
      and per-stage ``bf16_zero_pp_rank_0_mp_rank_0{0,1}_optim_states.pt`` holding the fp32 masters;
    * ``pipeline_zero0_fp32/``: fp32, ZeRO-0: the layer files are the model;
    * ``pipeline_bf16_zero0/``: bf16, ZeRO-0 (Megatron-DeepSpeed's usual setup): DeepSpeed's BF16_Optimizer
      keeps the fp32 masters in ``bf16_zero_pp_rank_0_mp_rank_0S_optim_states.pt`` and records no param
      shapes, only ``param_slice_mappings``;
    * ``pipeline_tp2/``: ZeRO-0 on a topology with a model axis (see ``PIPELINE_VARIANTS``).

    The oracle (``pipeline_oracle_path``): each stage's ``safe_get_full_fp32_param`` of every param (the
    param itself where there are no masters apart) and its ``module.state_dict()``, merged by rank 0."""
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "DS_ACCELERATOR": "cpu"})
    _init_gloo(rank, world_size, init_file)
    import deepspeed
    import torch
    import torch.distributed as dist
    from torch import nn
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from deepspeed.utils import safe_get_full_fp32_param

    deepspeed.init_distributed(dist_backend="gloo")  # PipelineModule asks DeepSpeed's comm for groups
    for name, extra in (PIPELINE_VARIANTS if variants is None else variants).items():
        torch.manual_seed(3)
        if name == PIPELINE_TP_DIR:
            topology = PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=1)
            pipe = PipelineModule(layers=_pipeline_layers(), topology=topology, loss_fn=nn.MSELoss())
        else:
            pipe = PipelineModule(layers=_pipeline_layers(PIPELINE_LAYERS.get(name, "std")),
                                  num_stages=1 if name == PIPELINE_ONE_STAGE_DIR else 2,
                                  loss_fn=nn.MSELoss(), partition_method="uniform")
        if PIPELINE_LAYERS.get(name) == "frozen":
            for param_name, param in pipe.named_parameters():
                if param_name.startswith("1."):
                    param.requires_grad_(False)
        config = {"steps_per_print": 10**6, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}, **extra}
        engine, *_ = deepspeed.initialize(model=pipe, model_parameters=[p for p in pipe.parameters() if p.requires_grad],
                                          config=config, dist_init_required=False)
        dtype = torch.bfloat16 if "bf16" in extra else torch.float32
        gen = torch.Generator().manual_seed(10)

        def batches():
            while True:
                yield torch.randn(2, 6, generator=gen).to(dtype), torch.randn(2, 6, generator=gen).to(dtype)

        data = batches()
        save = Path(out) / name
        for _ in range(2):
            engine.train_batch(data_iter=data)
            engine.save_checkpoint(str(save))
            dist.barrier()
        if name == PIPELINE_TP_DIR:  # no oracle: ckptscope refuses it (its ranks are not stages)
            continue
        part = save.parent / f"{name}.stage{rank}.tmp.pt"
        masters = {}
        for param_name, param in engine.module.named_parameters():
            master = safe_get_full_fp32_param(param)  # None without fp32 masters apart (fp32 ZeRO-0)
            masters[param_name] = (param if master is None else master).detach().float().clone()
        torch.save({"fp32": masters,
                    "module": {n: t.detach().clone() for n, t in engine.module.state_dict().items()}}, part)
        dist.barrier()
        if rank == 0:
            merged: dict = {"fp32": {}, "module": {}}
            for r in range(world_size):
                stage_part = save.parent / f"{name}.stage{r}.tmp.pt"
                loaded = torch.load(stage_part, weights_only=True)
                for key in merged:
                    merged[key].update(loaded[key])
                stage_part.unlink()
            torch.save(merged, pipeline_oracle_path(save))
        dist.barrier()
    dist.destroy_process_group()


MOE_VARIANTS = {MOE_DIR: {"zero_optimization": {"stage": 0}},
                "moe_bf16_zero0": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}},
                "moe_bf16_zero1": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}}
"""The MoE saves on 2 ranks (ep_size 2: one expert-parallel group, each expert group unpartitioned): fp32 and
bf16 at ZeRO-0 (the module plus every expert file) and bf16 ZeRO-1 (the experts' fp32 masters in param
groups of their own)."""
MOE_DP2_VARIANTS = {"moe_bf16_zero1_dp2": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}}
MOE_DE_VARIANTS = {"moe_bf16_zero2_dp2_de": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
                                             "use_data_before_expert_parallelism": True}}
"""On 4 ranks (ep_size 2 x expert data parallel 2): each expert group is partitioned over 2 ranks, in
DeepSpeed's default E + D topology (expert-parallel groups [0, 1], [2, 3]) and in its D + E one
([0, 2], [1, 3]). Each topology needs a spawn of its own: DeepSpeed makes the ``ep_size_2`` groups once
per process and keeps them, so a second engine with the other flag would run on the first's groups."""
MOE_TWO_SIZES_VARIANTS = {"moe_bf16_zero2_two_sizes": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
                                                       "net": "two_sizes"}}
"""On 4 ranks, two MoE layers of different expert-parallel sizes (4 experts at ep_size 2, 8 single-Linear
experts at ep_size 4 with PR-MoE's residual MLP, top-2), so the optimizer has two expert param groups,
partitioned over 2 ranks and 1. ``split_params_into_different_moe_groups_for_optimizer`` orders them per
process (by string hashes): in the shipped save ranks 1 and 2 have them the other way round from 0 and 3."""


def moe_oracle_path(save_dir: Path) -> Path:
    """What DeepSpeed's engine holds after the save of an MoE sample, every expert under its global id
    (local expert ``e`` of expert-parallel rank ``k``, by DeepSpeed's own ``groups``, is ``k * num_local +
    e``), gathered from every rank: at ZeRO-0 ``engine.module.state_dict()``; under ZeRO-1/2 the fp32
    masters, by DeepSpeed's ``safe_get_full_fp32_param``."""
    return save_dir.parent / f"{save_dir.name}.oracle.pt"


def _run_moe_rank(rank: int, world_size: int, out: str, init_file: str, variants: dict[str, dict] | None = None) -> None:
    """``MOE_VARIANTS``, each saved by DeepSpeed's engine after one step: ``deepspeed.moe.layer.MoE`` with 4
    experts at ep_size=2: ``layer_0_expert_{0..3}_mp_rank_00_model_states.pt`` beside
    ``mp_rank_00_model_states.pt`` (and, at ZeRO-0, ``expp_rank_{0,1}_mp_rank_00_optim_states.pt``). Its own
    spawn: DeepSpeed keeps the pipeline's groups."""
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "DS_ACCELERATOR": "cpu"})
    _init_gloo(rank, world_size, init_file)
    import deepspeed
    import torch
    import torch.distributed as dist
    from torch import nn
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.utils import groups as ds_groups, safe_get_full_fp32_param

    deepspeed.init_distributed(dist_backend="gloo")
    base = {"steps_per_print": 10**6, "zero_allow_untested_optimizer": True}

    class WithExperts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(6, 8)
            self.moe = MoE(hidden_size=8, expert=nn.Sequential(nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 8)),
                           num_experts=4, ep_size=2, k=1, use_residual=False, min_capacity=0)
            self.out = nn.Linear(8, 3)

        def forward(self, x):
            hidden, aux, _ = self.moe(self.inp(x))
            return self.out(hidden), aux

    class WithTwoSizes(WithExperts):
        def __init__(self) -> None:
            super().__init__()
            self.moe2 = MoE(hidden_size=8, expert=nn.Linear(8, 8), num_experts=8, ep_size=4, k=2, min_capacity=0,
                            use_residual=True)

        def forward(self, x):
            hidden, aux, _ = self.moe(self.inp(x))
            hidden, aux2, _ = self.moe2(hidden)
            return self.out(hidden), aux + aux2

    for name, extra in (variants or MOE_VARIANTS).items():
        extra = dict(extra)
        torch.manual_seed(5)
        net = WithTwoSizes() if extra.pop("net", None) == "two_sizes" else WithExperts()
        groups = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters()), "name": "p"})
        config = {**base, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, **extra}
        engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(groups, lr=1e-2), config=config,
                                          dist_init_required=False)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(20 + rank))
        out_, aux = engine(x.to(next(engine.module.parameters()).dtype))
        engine.backward(out_.float().square().mean() + aux)
        engine.step()
        engine.save_checkpoint(str(Path(out) / name))
        dist.barrier()
        if extra["zero_optimization"]["stage"]:  # collectives: every rank, the same order
            held = {key: safe_get_full_fp32_param(param) for key, param in engine.module.named_parameters()}
        else:
            held = engine.module.state_dict()
        layers = {f"{n}.deepspeed_moe.experts.deepspeed_experts.": m.deepspeed_moe for n, m in net.named_modules()
                  if isinstance(m, MoE)}
        mine = {}
        for key, value in held.items():
            for prefix, layer in layers.items():
                if key.startswith(prefix):
                    ep_rank = ds_groups._get_expert_parallel_rank(layer.ep_group_name)
                    e, rest = key[len(prefix):].split(".", 1)
                    key = f"{prefix}{ep_rank * layer.num_local_experts + int(e)}.{rest}"
            mine[key] = value.detach().clone()
        gathered = [None] * world_size
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            merged = {}
            for part in gathered:
                for key, value in part.items():
                    merged.setdefault(key, value)
            torch.save(merged, moe_oracle_path(Path(out) / name))
        dist.barrier()
    dist.destroy_process_group()


def write_pipeline_and_moe_samples(out: Path) -> tuple[Path, ...]:
    """The pipeline samples (``PIPELINE_VARIANTS``, ``PIPELINE_DP2_VARIANTS``) and the MoE ones
    (``MOE_VARIANTS``, ``MOE_DP2_VARIANTS``, ``MOE_DE_VARIANTS``, ``MOE_TWO_SIZES_VARIANTS``), with their
    oracles."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _spawn(_run_pipeline_rank, out, world_size=2)
    _spawn(_run_pipeline_dp2_rank, out, world_size=4)
    _spawn(_run_moe_rank, out, world_size=2)
    _spawn(functools.partial(_run_moe_rank, variants=MOE_DP2_VARIANTS), out, world_size=4)
    _spawn(functools.partial(_run_moe_rank, variants=MOE_DE_VARIANTS), out, world_size=4)
    _spawn(functools.partial(_run_moe_rank, variants=MOE_TWO_SIZES_VARIANTS), out, world_size=4)
    names = (*PIPELINE_VARIANTS, *PIPELINE_DP2_VARIANTS, *MOE_VARIANTS, *MOE_DP2_VARIANTS, *MOE_DE_VARIANTS,
             *MOE_TWO_SIZES_VARIANTS)
    for name in names:  # DeepSpeed's helper script is its code, not data
        for script in (out / name).glob("zero_to_*.py"):
            script.unlink()
    return tuple(out / name for name in names)


UNIVERSAL = "universal_zero{}"


def write_universal_samples(out: Path, stages: tuple[int, ...] = STAGES) -> dict[int, Path]:
    """``out/universal_zero{S}/``: DeepSpeed's own ``ds_to_universal`` run on ``out/zero{S}/global_step2``
    (``--inject_missing_state``, as its docs say for a plain ZeRO save): ``global_step2_universal/`` with
    the model-states file(s) and ``zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt``, and
    ``latest_universal``. Its ``fp32.pt`` masters equal the ``zero{S}.fp32_oracle.pt`` reconstruction."""
    import subprocess

    out = Path(out)
    written = {}
    for stage in stages:
        target = out / UNIVERSAL.format(stage)
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", str(out / f"zero{stage}" / TAG),
                        "--output_folder", str(target / f"{TAG}_universal"),
                        "--num_extract_workers", "1", "--num_merge_workers", "1", "--inject_missing_state"],
                       check=True, env={**os.environ, "DS_ACCELERATOR": "cpu"}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        written[stage] = target
    return written


TRAINER_ZERO3 = "trainer_zero3"

_TRAINER_SCRIPT = r"""
import json, os, sys
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments
out = sys.argv[1]

class Batches(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randint(0, 127, (8, 16), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}

torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                                     tie_word_embeddings=True))
ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": False},
      "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
args = TrainingArguments(output_dir=out, max_steps=2, save_steps=2, per_device_train_batch_size=4, report_to="none",
                         learning_rate=1e-2, deepspeed=ds)
Trainer(model=model, args=args, train_dataset=Batches()).train()
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
state = get_fp32_state_dict_from_zero_checkpoint(os.path.join(out, "checkpoint-2"))
torch.save({k: v.clone().contiguous() for k, v in state.items()}, out + ".fp32_oracle.pt")
"""


def write_trainer_zero3_sample(out: Path) -> Path:
    """``out/trainer_zero3/``: the transformers Trainer's ``output_dir`` after two steps under DeepSpeed
    ZeRO-3 (one gloo rank, fp32: the Trainer refuses bf16 on CPU), a tied Qwen2. Its ``checkpoint-2/``
    holds ``config.json``, ``latest``, ``global_step2/zero_pp_rank_0_mp_rank_00_{model,optim}_states.pt``
    and the Trainer's side files, but no HF weights: under ZeRO-3 (without
    ``stage3_gather_16bit_weights_on_model_save``) the Trainer saves none. Oracle: DeepSpeed's
    ``get_fp32_state_dict_from_zero_checkpoint`` of ``checkpoint-2``, in ``out/trainer_zero3.fp32_oracle.pt``."""
    import subprocess

    target = Path(out) / TRAINER_ZERO3
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29547", "DS_ACCELERATOR": "cpu",
           "ACCELERATE_USE_DEEPSPEED": "true"}
    subprocess.run([sys.executable, "-c", _TRAINER_SCRIPT, str(target)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return target


ZERO2_FP32_BIN = "zero2_fp32_bin"


def write_zero_to_fp32_bin(out: Path) -> Path:
    """``out/zero2_fp32_bin/pytorch_model.bin``: DeepSpeed's ``convert_zero_checkpoint_to_fp32_state_dict``
    (what its ``zero_to_fp32.py`` runs) on ``out/zero2`` with ``safe_serialization=False``. Every tensor
    in it is a view of one flat fp32 storage per param group, as DeepSpeed reconstructs them."""
    import subprocess

    target = Path(out) / ZERO2_FP32_BIN
    code = ("import sys; from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as c; "
            "c(sys.argv[1], sys.argv[2], safe_serialization=False)")
    subprocess.run([sys.executable, "-c", code, str(Path(out) / "zero2"), str(target)], check=True,
                   env={**os.environ, "DS_ACCELERATOR": "cpu"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return target


# --- AutoTP: DeepSpeed's own tensor parallelism (``tensor_parallel.autotp_size``) ---------------------------

AUTOTP_VARIANTS: dict[str, dict] = {
    # name: model, ZeRO stage, TP size, DP size, tied embedding, vocab, bf16
    "autotp_llama_tp2": {"arch": "llama", "stage": 1, "tp": 2, "dp": 1, "tied": False, "vocab": 38, "bf16": False},
    "autotp_qwen2_tied_tp2": {"arch": "qwen2", "stage": 2, "tp": 2, "dp": 1, "tied": True, "vocab": 38, "bf16": False},
    "autotp_qwen2_tp3": {"arch": "qwen2", "stage": 1, "tp": 3, "dp": 1, "tied": False, "vocab": 37, "bf16": False},
    "autotp_llama_tp2_dp2_bf16": {"arch": "llama", "stage": 2, "tp": 2, "dp": 2, "tied": False, "vocab": 38,
                                  "bf16": True},
}
"""Each a real AutoTP training save: column-parallel q/k/v/gate/up and lm_head split on dim 0, row-parallel
o/down on dim 1, norms replicated; the tied Qwen2 gets HF's vocabulary-parallel embedding (the tie an alias
in ``shared_params``); TP=3 over 2 KV heads splits whole heads, so rank 2 holds empty q/k/v/o shards, and the
odd vocabulary splits lm_head 13/12/12; TP=2 x DP=2 has ZeRO-2 partitions within each TP rank, bf16
module copies and fp32 masters."""
AUTOTP_CONFIG = {"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 32}


def autotp_oracle_path(save_dir: Path) -> Path:
    return save_dir.parent / f"{save_dir.name}.oracle.pt"


def _run_autotp_rank(rank: int, world_size: int, out: str, init_file: str, *, name: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "DS_ACCELERATOR": "cpu"})
    _init_gloo(rank, world_size, init_file)
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    v = AUTOTP_VARIANTS[name]
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if v["arch"] == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(**AUTOTP_CONFIG, vocab_size=v["vocab"], tie_word_embeddings=v["tied"])
    torch.manual_seed(7)
    model = model_cls(config).float()
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": v["stage"]}, "tensor_parallel": {"autotp_size": v["tp"]},
          "steps_per_print": 10_000, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    if v["bf16"]:
        ds["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds,
                                      dist_init_required=False)
    gen = torch.Generator().manual_seed(100 + engine.mpu.get_data_parallel_rank())  # the same data on a TP group
    for _ in range(2):
        ids = torch.randint(0, v["vocab"], (1, 8), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    save_dir = Path(out) / name
    engine.save_checkpoint(str(save_dir), tag=TAG)
    consolidated = engine._consolidated_16bit_state_dict()  # collective: DeepSpeed gathers every TP shard
    if rank == 0:
        config.save_pretrained(Path(out) / f"{name}_hf_config")
        torch.save({"consolidated": {k: t.detach().clone().contiguous() for k, t in consolidated.items()}},
                   autotp_oracle_path(save_dir))
    dist.barrier()
    dist.destroy_process_group()


def _universal_oracle(save_dir: Path) -> None:
    """Add DeepSpeed's ``ds_to_universal`` view of the save (whole fp32 masters and Adam moments per param,
    rebuilt by its own tool from the TP shards) to the oracle file, then remove the universal dir."""
    import shutil
    import subprocess
    import tempfile

    import torch

    oracle = torch.load(autotp_oracle_path(save_dir), weights_only=False)
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "universal"
        run = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                              "--input_folder", str(save_dir / TAG), "--output_folder", str(target),
                              "--num_extract_workers", "1", "--num_merge_workers", "1"],
                             env={**os.environ, "DS_ACCELERATOR": "cpu"}, capture_output=True, text=True)
        if run.returncode:  # DeepSpeed 0.19.8's own tool fails on TP ranks holding empty shards (TP=3, 2 KV heads)
            oracle["universal_error"] = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
            torch.save(oracle, autotp_oracle_path(save_dir))
            return
        universal: dict[str, dict] = {}
        for param_dir in sorted((target / "zero").iterdir()):
            for state in ("fp32", "exp_avg", "exp_avg_sq"):
                file = param_dir / f"{state}.pt"
                if file.is_file():
                    value = torch.load(file, map_location="cpu", weights_only=False)
                    value = value["param"] if isinstance(value, dict) else value
                    universal.setdefault(state, {})[param_dir.name] = value.detach().clone().contiguous()
        shutil.rmtree(target, ignore_errors=True)
    oracle["universal"] = universal
    torch.save(oracle, autotp_oracle_path(save_dir))


def write_autotp_samples(out: Path, names: tuple[str, ...] = tuple(AUTOTP_VARIANTS)) -> dict[str, Path]:
    """``out/autotp_*/`` (save dirs, tag ``global_step2``), ``out/autotp_*.oracle.pt`` (``consolidated``: the
    engine's own ``_consolidated_16bit_state_dict``, every TP shard gathered by DeepSpeed; ``universal``:
    ``ds_to_universal``'s whole fp32 masters and moments) and ``out/autotp_*_hf_config/``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    written = {}
    for name in names:
        v = AUTOTP_VARIANTS[name]
        _spawn(functools.partial(_run_autotp_rank, name=name), out, world_size=v["tp"] * v["dp"])
        _universal_oracle(out / name)
        written[name] = out / name
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    written = write_deepspeed_samples(Path(argv[0]))
    write_universal_samples(Path(argv[0]))
    write_pipeline_and_moe_samples(Path(argv[0]))
    write_trainer_zero3_sample(Path(argv[0]))
    write_zero_to_fp32_bin(Path(argv[0]))
    write_autotp_samples(Path(argv[0]))
    print(json.dumps({stage: str(path) for stage, path in written.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
