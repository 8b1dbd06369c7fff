#!/usr/bin/env python
"""Write tiny MoE checkpoints (HF and megatron-core) for the MoE Megatron writers' tests.

    python sample_ckpts/make_moe_samples.py [OUT_DIR]

HF side (transformers ``save_pretrained``, random weights everywhere, fp32):

* ``write_hf_moe(kind, out)``: ``hf_<kind>/`` for ``mixtral`` (MixtralForCausalLM), ``qwen2_moe``
  (Qwen2MoeForCausalLM, shared expert with its sigmoid gate, q/k/v biases) and ``qwen3_moe``
  (Qwen3MoeForCausalLM, q/k norms, head_dim 16, tied embeddings): hidden 32, 2 layers, 4 experts
  (top 2), vocab 100.

megatron-core side (GPTModel, local spec with ``num_experts``: SequentialMLP experts, one gloo rank
unless said otherwise; megatron-core touches ``torch.cuda`` on CPU, stubbed as in
make_mcore_pair_samples.py):

* ``moe_args(kind, ...)``: Megatron args of the same three shapes (vocab padded to 128).
* ``random_moe_state(args)``: ``state_dict_for_save_checkpoint()`` of a TP=1 model, every
  parameter (and the router's ``expert_bias`` buffer, when enabled) random.
* ``save_dist_moe(state, args, iter_dir)``: megatron-core's own ``dist_checkpointing.save`` of it.
* ``moe_rank_references(dist_dirs, cases, out)``: on 2 gloo ranks, for each case (TP=2, EP=2, PP=2,
  TP=2 with expert TP 1) the rank's model loads a torch_dist dir with megatron-core's
  ``dist_checkpointing.load`` (which reshards) and saves its ``state_dict_for_save_checkpoint()``
  as ``out/<case>/<mp_rank dir>/reference.pt``: what a legacy rank file must hold.

The command line writes the HF dirs, one megatron-core torch_dist dir per kind and every case's
references under OUT_DIR; tests call the functions into temporary directories instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from make_mcore_pair_samples import cpu_megatron, ensure_single_rank_world, transformer_config
from make_mcore_rank_refs import prepare_parallel, run_reference_cases, spawn_references

ITERATION = 5
SEED = 4321
KINDS = ("mixtral", "qwen2_moe", "qwen3_moe")

_BASE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 100, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "num_experts_per_tok": 2}
HF_MOE: dict[str, tuple[str, dict]] = {
    "mixtral": ("MixtralForCausalLM", dict(_BASE, intermediate_size=24, num_local_experts=4,
                                           tie_word_embeddings=False)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", dict(_BASE, intermediate_size=48, moe_intermediate_size=16,
                                              shared_expert_intermediate_size=24, num_experts=4,
                                              tie_word_embeddings=False)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(_BASE, intermediate_size=48, moe_intermediate_size=16, num_experts=4,
                                              head_dim=16, tie_word_embeddings=True)),
}
"""kind -> (transformers class, config kwargs)."""

CASES: tuple[dict, ...] = (
    {"name": "tp2_qwen2_moe", "kind": "qwen2_moe", "tp": 2, "pp": 1, "ep": 1},
    {"name": "tp2_mixtral", "kind": "mixtral", "tp": 2, "pp": 1, "ep": 1},
    {"name": "ep2_qwen2_moe", "kind": "qwen2_moe", "tp": 1, "pp": 1, "ep": 2},
    {"name": "pp2_qwen3_moe", "kind": "qwen3_moe", "tp": 1, "pp": 2, "ep": 1},
    {"name": "tp2_etp1_mixtral", "kind": "mixtral", "tp": 2, "pp": 1, "ep": 1, "etp": 1},
)
"""Legacy reference cases, each on 2 gloo ranks."""


# --- HF ----------------------------------------------------------------------------------------------


def hf_moe_config(kind: str):
    import transformers

    cls_name, kwargs = HF_MOE[kind]
    return getattr(transformers, cls_name).config_class(**kwargs)


def write_hf_moe(kind: str, out: Path, seed: int = SEED) -> Path:
    """``hf_<kind>/`` by ``save_pretrained``: per-expert keys on disk, fp32, every tensor random
    (norms around 1, matrices scaled by 1/sqrt(fan-in)), so any misplaced slice shows."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cls_name, _ = HF_MOE[kind]
    model = getattr(transformers, cls_name)(hf_moe_config(kind)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                value = 1.0 + 0.2 * torch.randn(param.shape, generator=gen)
            elif name.endswith(".bias"):
                value = 0.2 * torch.randn(param.shape, generator=gen)
            else:
                value = torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5
            param.copy_(value)
    target = Path(out) / f"hf_{kind}"
    model.save_pretrained(target)
    return target


# --- megatron-core -------------------------------------------------------------------------------------


def moe_args(kind: str, *, tp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None,
             expert_bias: bool = False) -> argparse.Namespace:
    """Megatron args of one tiny MoE kind (names as in Megatron-LM's arguments.py)."""
    import torch

    config = hf_moe_config(kind)
    values = {
        "num_layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
        "ffn_hidden_size": config.intermediate_size, "num_attention_heads": config.num_attention_heads,
        "group_query_attention": True, "num_query_groups": config.num_key_value_heads,
        "kv_channels": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        "vocab_size": config.vocab_size, "padded_vocab_size": 128, "make_vocab_size_divisible_by": 128,
        "untie_embeddings_and_output_weights": not config.tie_word_embeddings,
        "swiglu": True, "normalization": "RMSNorm", "norm_epsilon": 1e-6, "add_qkv_bias": kind == "qwen2_moe",
        "add_bias_linear": False, "qk_layernorm": kind == "qwen3_moe", "position_embedding_type": "rope",
        "rotary_base": 10000, "rotary_percent": 1.0, "rotary_interleaved": False, "max_position_embeddings": 64,
        "seq_length": 64, "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep, "params_dtype": torch.float32, "bf16": False, "fp16": False,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "transformer_impl": "local",
        "num_experts": 4, "moe_ffn_hidden_size": getattr(config, "moe_intermediate_size", config.intermediate_size),
        "moe_router_topk": 2, "moe_grouped_gemm": False, "moe_router_enable_expert_bias": expert_bias,
    }
    if etp is not None:
        values["expert_tensor_parallel_size"] = etp
    if kind == "qwen2_moe":
        values["moe_shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
        values["moe_shared_expert_gate"] = True
    if expert_bias:  # megatron-core wants a sigmoid score function for the expert bias
        values["moe_router_score_function"] = "sigmoid"
    return argparse.Namespace(**values)


def moe_transformer_config(args: argparse.Namespace):
    """The dense TransformerConfig of make_mcore_pair_samples.py plus the MoE fields."""
    return dataclasses.replace(
        transformer_config(args), num_moe_experts=args.num_experts, moe_ffn_hidden_size=args.moe_ffn_hidden_size,
        moe_router_topk=args.moe_router_topk, moe_grouped_gemm=False, moe_token_dispatcher_type="allgather",
        moe_aux_loss_coeff=0.0, moe_shared_expert_intermediate_size=getattr(args, "moe_shared_expert_intermediate_size",
                                                                            None),
        moe_shared_expert_gate=getattr(args, "moe_shared_expert_gate", False),
        moe_router_enable_expert_bias=args.moe_router_enable_expert_bias,
        moe_router_score_function=getattr(args, "moe_router_score_function", "softmax"),
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=getattr(args, "expert_tensor_parallel_size", None),
        pipeline_model_parallel_size=args.pipeline_model_parallel_size, pipeline_dtype=args.params_dtype,
        sequence_parallel=args.tensor_model_parallel_size > 1 and args.expert_model_parallel_size > 1)


def build_moe_model(args: argparse.Namespace):
    """The GPTModel (local spec, SequentialMLP experts) of this rank; parallel state must be set."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    pp = args.pipeline_model_parallel_size
    pp_rank = parallel_state.get_pipeline_model_parallel_rank() if pp > 1 else 0
    spec = get_gpt_layer_local_spec(num_experts=args.num_experts, moe_grouped_gemm=False,
                                    normalization=args.normalization, qk_layernorm=args.qk_layernorm)
    return GPTModel(
        config=moe_transformer_config(args), transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pp_rank == 0, post_process=pp_rank == pp - 1,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
    ).eval()


def random_moe_state(args: argparse.Namespace, seed: int = 0) -> OrderedDict:
    """``state_dict_for_save_checkpoint()`` of a TP=1 MoE GPTModel, every parameter (and the router's
    expert_bias buffer) random and distinct (this process, gloo world of 1)."""
    import torch

    ensure_single_rank_world()
    with cpu_megatron():
        model = build_moe_model(args)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, param in model.named_parameters():
                param.copy_(torch.randn(param.shape, generator=gen) / max(1, param.shape[-1]) ** 0.5)
            for name, buffer in model.named_buffers():
                if name.endswith("expert_bias"):
                    buffer.copy_(torch.randn(buffer.shape, generator=gen))
        return OrderedDict((k, v.clone() if isinstance(v, torch.Tensor) else v)
                           for k, v in model.state_dict_for_save_checkpoint().items())


def save_dist_moe(state: OrderedDict, args: argparse.Namespace, iter_dir: Path) -> Path:
    """megatron-core ``dist_checkpointing.save`` of a TP=1 MoE GPTModel holding ``state`` (this process)."""
    from megatron.core import dist_checkpointing

    ensure_single_rank_world()
    with cpu_megatron():
        model = build_moe_model(args)
        model.load_state_dict(state, strict=True)
        Path(iter_dir).mkdir(parents=True, exist_ok=True)
        common = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}
        dist_checkpointing.save({**common, "model": model.sharded_state_dict()}, str(iter_dir))
    return Path(iter_dir)


def load_dist_moe(args: argparse.Namespace, iter_dir: Path) -> dict:
    """A fresh TP=1 MoE GPTModel (parameters NaN first) filled by megatron-core's
    ``dist_checkpointing.load`` from ``iter_dir``; returns its ``state_dict_for_save_checkpoint()``."""
    import torch
    from megatron.core import dist_checkpointing

    ensure_single_rank_world()
    with cpu_megatron():
        model = build_moe_model(args)
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(iter_dir))
        model.load_state_dict(loaded["model"], strict=True)
        return OrderedDict(model.state_dict_for_save_checkpoint())


def _moe_case(case: dict, dist_dirs: dict[str, str]):
    args = moe_args(case["kind"], tp=case["tp"], pp=case["pp"], ep=case["ep"], etp=case.get("etp"))
    prepare_parallel(case["tp"], case["pp"], case["ep"], case.get("etp"))
    return args, build_moe_model(args), dist_dirs[case["kind"]]


def _references_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    run_reference_cases(rank, world_size, out, init_file, _moe_case)


def moe_rank_references(dist_dirs: dict[str, Path], out: Path, cases: tuple[dict, ...] = CASES) -> Path:
    """Per-rank references for ``cases`` from torch_dist dirs ``{kind: iter_dir}`` (2 gloo ranks)."""
    return spawn_references(_references_rank, dist_dirs, out, cases)


def write_all(out: Path) -> Path:
    """HF dirs, megatron-core torch_dist dirs (one per kind) and every case's references."""
    out = Path(out) / "moe"
    dist_dirs = {}
    for seed, kind in enumerate(KINDS):
        write_hf_moe(kind, out)
        args = moe_args(kind)
        dist_dirs[kind] = save_dist_moe(random_moe_state(args, seed), args, out / f"dist_{kind}")
    moe_rank_references(dist_dirs, out / "references")
    return out


WRITERS = {"moe": write_all}


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
