#!/usr/bin/env python
"""Write Megatron-LM legacy ``--ckpt-format torch`` samples (per-rank ``mp_rank_*/model_optim_rng.pt``).

    python sample_ckpts/make_legacy_samples.py [OUT_DIR] [--only NAME ...]   # default: sample_ckpts/

A tiny megatron-core ``GPTModel`` (local spec, SwiGLU, RMSNorm, GQA: 4 heads in 2 query groups,
padded vocab) is built on gloo CPU ranks and saved the way Megatron training's
``save_checkpoint`` does for the legacy format (FORMATS.md §3): one ``torch.save`` per unique
(tp, pp, ep) rank of ``{"args": Namespace, "checkpoint_version": 3.0, "iteration", "model" (or
"model0", "model1" with virtual pipeline), "optimizer", "opt_param_scheduler", "rng_state",
"num_floating_point_operations_so_far"}`` into ``iter_XXXXXXX/mp_rank_TT[_PPP][_EEE]/``, then
``latest_checkpointed_iteration.txt``. ``megatron.training`` is not installed, so the dict is
assembled here from megatron-core's ``state_dict_for_save_checkpoint`` with the same keys.

Cases (``CASES``): ``megatron_legacy_tp2`` (TP=2, bf16, distributed optimizer -> ``distrib_optim.pt``;
the shipped sample), ``megatron_legacy_pp2`` (PP=2 with an uneven first stage, tied embeddings so
the last stage holds an ``output_layer`` copy), ``megatron_legacy_vpp`` (TP=2 PP=2 VPP=2, 4 ranks)
and ``megatron_legacy_ep2`` (MoE, 4 experts over EP=2, SequentialMLP ``local_experts.{i}``).

With ``reference=True`` every TP-rank-0 process also writes ``<case>_reference/rank_R.pt``: its
stage's parameters gathered over TP by megatron's own parameter attributes (``partition_dim``,
``partition_stride``), named with megatron's global layer numbers (``layer_number - 1``) and global
expert ids (``local_expert_indices``). Tests use it as the oracle; ckptscope's reader derives the
same from names and ``args`` only.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_dist_samples import _init_gloo, _spawn, _stub_cuda

ITERATION = 20
HIDDEN, FFN, HEADS, GROUPS = 32, 48, 4, 2
TRUE_VOCAB, DIVISIBLE_BY, SEQ = 100, 64, 16

CASES: dict[str, dict] = {
    "megatron_legacy_tp2": {"tp": 2, "num_layers": 2, "bf16": True, "dist_opt": True},
    "megatron_legacy_pp2": {"pp": 2, "num_layers": 3, "first_stage_layers": 1},
    "megatron_legacy_vpp": {"tp": 2, "pp": 2, "vpp": 2, "num_layers": 8},
    "megatron_legacy_ep2": {"ep": 2, "num_layers": 2, "experts": 4},
}


def padded_vocab(tp: int) -> int:
    """Megatron's ``vocab_size_with_padding``: a multiple of ``make_vocab_size_divisible_by * TP``."""
    step = DIVISIBLE_BY * tp
    return -(-TRUE_VOCAB // step) * step


def rank_dir_name(tp_rank: int, pp_rank: int, ep_rank: int, pp: int, ep: int) -> str:
    """``get_checkpoint_name``'s rank folder: PP suffix iff PP > 1, EP suffix iff EP > 1."""
    name = f"mp_rank_{tp_rank:02d}"
    if pp > 1:
        name += f"_{pp_rank:03d}"
    if ep > 1:
        name += f"_{ep_rank:03d}"
    return name


def _args(case: dict, torch, attn_backend) -> argparse.Namespace:
    """The training ``args`` Megatron pickles into every rank file (a relevant subset)."""
    tp, pp, ep = case.get("tp", 1), case.get("pp", 1), case.get("ep", 1)
    return argparse.Namespace(
        num_layers=case["num_layers"], hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        num_query_groups=GROUPS, group_query_attention=True, kv_channels=HIDDEN // HEADS, swiglu=True,
        normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False,
        vocab_size=TRUE_VOCAB, make_vocab_size_divisible_by=DIVISIBLE_BY, padded_vocab_size=padded_vocab(tp),
        seq_length=SEQ, max_position_embeddings=SEQ, untie_embeddings_and_output_weights=False,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=case.get("vpp"),
        num_layers_in_first_pipeline_stage=case.get("first_stage_layers"), num_layers_in_last_pipeline_stage=None,
        decoder_first_pipeline_num_layers=case.get("first_stage_layers"), decoder_last_pipeline_num_layers=None,
        account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False,
        pipeline_model_parallel_layout=None,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=tp, num_experts=case.get("experts"),
        moe_router_topk=2 if case.get("experts") else None, moe_grouped_gemm=False,
        sequence_parallel=False, bf16=case.get("bf16", False), fp16=False,
        params_dtype=torch.bfloat16 if case.get("bf16") else torch.float32,
        transformer_impl="local", attention_backend=attn_backend, use_distributed_optimizer=case.get("dist_opt", False),
        ckpt_format="torch", iteration=ITERATION, lr=3e-4, min_lr=3e-5, lr_decay_style="cosine",
        seed=1234, save="(generated)", world_size=tp * pp * ep,
    )


def _full_tensor(torch, parallel_state, param, tensor):
    """Gather a TP-sharded parameter by megatron's own attributes (the test oracle)."""
    if not getattr(param, "tensor_model_parallel", False):
        return tensor.clone()
    expert = getattr(param, "allreduce", True) is False
    group = (parallel_state.get_expert_tensor_parallel_group() if expert
             else parallel_state.get_tensor_model_parallel_group())
    size = torch.distributed.get_world_size(group)
    if size == 1:
        return tensor.clone()
    parts = [torch.empty_like(tensor) for _ in range(size)]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    pieces = [p.chunk(stride, dim=dim) for p in parts]
    return torch.cat([pieces[t][k] for k in range(stride) for t in range(size)], dim=dim)


def _global_name(model, name: str) -> str:
    """``name`` with megatron's global layer number and global expert id (oracle naming)."""
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        layer = model.decoder.layers[int(parts[2])]
        parts[2] = str(layer.layer_number - 1)
        if "local_experts" in parts:
            j = parts.index("local_experts") + 1
            parts[j] = str(layer.mlp.local_expert_indices[int(parts[j])])
    return ".".join(parts)


def _legacy_rank(rank: int, world_size: int, out: str, init_file: str, *, names: list[str], reference: bool) -> None:
    """One process: every case in turn on the same gloo world (ranks beyond DP rank 0 do not write)."""
    import warnings

    warnings.filterwarnings("ignore")
    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    import torch
    from megatron.core import parallel_state

    # language_module moves the tied embedding to cuda before its all-reduce (generator-only stub).
    torch.Tensor.cuda = lambda self, *a, **k: self
    for name in names:
        _save_case(rank, out, name, reference)
        parallel_state.destroy_model_parallel()
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _save_case(rank: int, out: str, name: str, reference: bool) -> None:
    import random

    import numpy as np
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    case = CASES[name]
    tp, pp, ep, vpp = case.get("tp", 1), case.get("pp", 1), case.get("ep", 1), case.get("vpp")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=ep,
    )
    dtype = torch.bfloat16 if case.get("bf16") else torch.float32
    moe = {}
    if case.get("experts"):
        moe = {"num_moe_experts": case["experts"], "moe_router_topk": 2, "moe_ffn_hidden_size": FFN,
                   "expert_model_parallel_size": ep}
    config = TransformerConfig(
        num_layers=case["num_layers"], hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        num_query_groups=GROUPS, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        normalization="RMSNorm", use_cpu_initialization=True, bf16=case.get("bf16", False), params_dtype=dtype,
        pipeline_dtype=dtype, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, num_layers_in_first_pipeline_stage=case.get("first_stage_layers"),
        **moe,
    )
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", num_experts=case.get("experts"))
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    models = []
    for v in range(vpp or 1):
        vp_stage = v if vpp else None
        models.append(GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=padded_vocab(tp), max_sequence_length=SEQ,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=True, position_embedding_type="rope", vp_stage=vp_stage,
        ))
    # Distinct values per parameter and TP shard; replicas (norms across TP, dense weights across EP,
    # the tied last-stage output layer) get identical values, as training keeps them.
    tied = "output_layer.weight"
    with torch.no_grad():
        for model in models:
            for pname, param in model.named_parameters():
                seed_name = _global_name(model, pname)
                if seed_name == tied and not models[0].pre_process:
                    seed_name = "embedding.word_embeddings.weight"
                shard = tp_rank if getattr(param, "tensor_model_parallel", False) else -1
                gen = torch.Generator().manual_seed(zlib.crc32(f"{seed_name}/{shard}".encode()))
                param.copy_(torch.randn(param.shape, generator=gen).to(param.dtype))

    params = [p for m in models for p in m.parameters()]
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    optimizer = torch.optim.Adam(masters, lr=3e-4, betas=(0.9, 0.95))
    sum((m.double() ** 2).sum() for m in masters).backward()
    optimizer.step()

    args = _args(case, torch, AttnBackend.auto)
    state: dict = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}
    if len(models) == 1:
        state["model"] = models[0].state_dict_for_save_checkpoint()
    else:
        for v, model in enumerate(models):
            state[f"model{v}"] = model.state_dict_for_save_checkpoint()
    inner = optimizer.state_dict()
    if case.get("dist_opt"):
        # DistributedOptimizer.state_dict: param groups without "params"; tensors go to distrib_optim.pt.
        groups = [{k: v for k, v in g.items() if k != "params"} for g in inner["param_groups"]]
        state["optimizer"] = {"optimizer": {"param_groups": groups}}
    elif case.get("bf16"):
        state["optimizer"] = {"optimizer": inner, "fp32_from_fp16_params": [[m.detach() for m in masters]]}
    else:
        state["optimizer"] = inner  # FP32Optimizer.state_dict is the torch optimizer's
    state["opt_param_scheduler"] = {"max_lr": 3e-4, "min_lr": 3e-5, "lr_warmup_steps": 2, "num_steps": ITERATION,
                                    "lr_decay_steps": 100, "lr_decay_style": "cosine", "start_wd": 0.1,
                                    "end_wd": 0.1, "wd_incr_style": "constant", "wd_incr_steps": 100}
    state["rng_state"] = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                           "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {}}]
    state["num_floating_point_operations_so_far"] = 1.5e9

    root = Path(out) / name
    iter_dir = root / f"iter_{ITERATION:07d}"
    rank_dir = iter_dir / rank_dir_name(tp_rank, pp_rank, ep_rank, pp, ep)
    # One writer per (tp, pp, ep) shard: the expert-data-parallel rank 0 (as Megatron's save_checkpoint).
    writer = parallel_state.get_expert_data_parallel_rank() == 0 if ep > 1 else \
        parallel_state.get_data_parallel_rank() == 0
    if writer:
        rank_dir.mkdir(parents=True, exist_ok=True)
        torch.save(state, rank_dir / "model_optim_rng.pt")
    if writer and case.get("dist_opt"):
        # get_parameter_state_dp_zero's layout: per grad buffer, per (param, grad) dtype, flat fp32 vectors.
        flat = {k: torch.cat([optimizer.state[m][k].reshape(-1) for m in masters]) for k in ("exp_avg", "exp_avg_sq")}
        buffer = {"param": torch.cat([m.detach().reshape(-1) for m in masters]), **flat,
                  "numel_unpadded": sum(m.numel() for m in masters)}
        torch.save({"buckets_coalesced": True, 0: {(dtype, torch.float32): buffer}}, rank_dir / "distrib_optim.pt")

    if reference:
        gathered = {}
        for model in models:
            named = dict(model.named_parameters())
            for key, value in model.state_dict_for_save_checkpoint().items():
                if isinstance(value, torch.Tensor) and key in named:
                    gathered[_global_name(model, key)] = _full_tensor(torch, parallel_state, named[key], value)
        if writer and tp_rank == 0:
            ref_dir = Path(out) / f"{name}_reference"
            ref_dir.mkdir(parents=True, exist_ok=True)
            torch.save(gathered, ref_dir / f"rank_{rank}.pt")
    torch.distributed.barrier()
    if rank == 0:
        (root / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


def _world(name: str) -> int:
    case = CASES[name]
    return case.get("tp", 1) * case.get("pp", 1) * case.get("ep", 1)


def write_cases(out: Path, names: list[str], *, reference: bool = False) -> dict[str, Path]:
    """Write several cases in one set of processes (megatron is imported once per process).

    Each case gets the save root ``out/<name>/`` (and ``out/<name>_reference/`` if asked). The world
    is the largest case's; smaller cases run with data parallelism, whose extra ranks do not write.
    """
    out.mkdir(parents=True, exist_ok=True)
    world = max(_world(n) for n in names)
    if any(world % _world(n) for n in names):
        raise ValueError(f"case sizes {[_world(n) for n in names]} do not divide one world")
    _spawn(partial(_legacy_rank, names=list(names), reference=reference), out, world)
    return {name: out / name for name in names}


def write_case(out: Path, name: str, *, reference: bool = False) -> Path:
    """Write one case's save root ``out/<name>/``."""
    return write_cases(out, [name], reference=reference)[name]


WRITERS = {"megatron_legacy_tp2": partial(write_case, name="megatron_legacy_tp2")}
"""What ships in sample_ckpts/ (the other CASES are written by the tests into temp dirs)."""


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    # By default only the shipped sample; ``--only NAME`` may name any case.
    argv = sys.argv[1:] if argv is None else argv
    writers = {name: partial(write_case, name=name) for name in CASES}
    chosen = writers if "--only" in argv else WRITERS
    return run_writers(chosen, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
