#!/usr/bin/env python
"""Write megatron-core's own per-rank reference state dicts for the Megatron writers' tests.

    python sample_ckpts/make_mcore_rank_refs.py [OUT_DIR]

* ``random_model_state(args)``: a tiny GPTModel (local spec, SwiGLU, GQA 4 heads / 2 groups, RMSNorm)
  on one rank, every parameter random, as ``state_dict_for_save_checkpoint()`` gives it (TP=1).
* ``save_dist(state, args, iter_dir)``: megatron-core ``dist_checkpointing.save`` of that model, the
  common state Megatron training writes included.
* ``rank_references(dist_dirs, cases, out)``: on 2 gloo ranks, for each case (TP=2, or PP=2 even and
  uneven, tied or untied) build the GPTModel of that rank, fill it with megatron-core's own
  ``dist_checkpointing.load`` from a torch_dist dir (which reshards), and save
  ``state_dict_for_save_checkpoint()`` as ``out/<case>/<mp_rank dir>/reference.pt``: what a legacy
  ``--ckpt-format torch`` file of that rank must hold.

The command line writes both variants' torch_dist dirs and every case's references under OUT_DIR;
tests call the functions into temporary directories instead (loading ckptscope's own torch_dist
output). megatron-core touches ``torch.cuda`` on CPU (FORMATS.md §11; a tied last pipeline stage also
calls ``Tensor.cuda()``); it is stubbed only in the spawned ranks here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from make_dist_samples import _init_gloo, _spawn, _stub_cuda
from make_mcore_pair_samples import cpu_megatron, ensure_single_rank_world, transformer_config

ITERATION = 3
JOB_FILE = "job.json"
CASES: tuple[dict, ...] = (
    {"name": "tp2_untied", "tied": False, "tp": 2, "pp": 1},
    {"name": "tp2_tied", "tied": True, "tp": 2, "pp": 1},
    {"name": "pp2_untied", "tied": False, "tp": 1, "pp": 2},
    {"name": "pp2_tied", "tied": True, "tp": 1, "pp": 2},
    {"name": "pp2_uneven", "tied": False, "tp": 1, "pp": 2, "args": {"num_layers_in_first_pipeline_stage": 1}},
    # one query group on 2 TP ranks: megatron-core splits the fused QKV rows evenly, not by group
    {"name": "tp2_mqa", "tied": False, "tp": 2, "pp": 1, "variant": "mqa", "args": {"num_query_groups": 1}},
)


def tiny_args(tied: bool, **overrides) -> argparse.Namespace:
    """Megatron args of the tiny GPT: 4 layers, H=32, F=48, 4 heads in 2 KV groups, vocab 250 padded to 256."""
    import torch

    values = {
        "num_layers": 4, "hidden_size": 32, "ffn_hidden_size": 48, "num_attention_heads": 4,
        "group_query_attention": True, "num_query_groups": 2, "kv_channels": 8, "vocab_size": 250,
        "padded_vocab_size": 256, "make_vocab_size_divisible_by": 128, "untie_embeddings_and_output_weights": not tied,
        "swiglu": True, "normalization": "RMSNorm", "norm_epsilon": 1e-5, "add_qkv_bias": False,
        "add_bias_linear": False, "qk_layernorm": False, "position_embedding_type": "rope", "rotary_base": 10000,
        "rotary_percent": 1.0, "rotary_interleaved": False, "max_position_embeddings": 64, "seq_length": 64,
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "params_dtype": torch.float32,
        "bf16": False, "fp16": False, "hidden_dropout": 0.0, "attention_dropout": 0.0, "transformer_impl": "local",
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def build_rank_model(args: argparse.Namespace):
    """The GPTModel (local spec) this rank builds for ``args``' TP/PP sizes; parallel state must be set."""
    import dataclasses

    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    pp = args.pipeline_model_parallel_size
    config = dataclasses.replace(
        transformer_config(args), pipeline_model_parallel_size=pp, pipeline_dtype=args.params_dtype,
        num_layers_in_first_pipeline_stage=getattr(args, "num_layers_in_first_pipeline_stage", None),
        num_layers_in_last_pipeline_stage=getattr(args, "num_layers_in_last_pipeline_stage", None))
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    spec = get_gpt_layer_local_spec(normalization=args.normalization, qk_layernorm=args.qk_layernorm)
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pp_rank == 0, post_process=pp_rank == pp - 1,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
    ).eval()


def prepare_parallel(tp: int, pp: int, ep: int = 1, etp: int | None = None) -> None:
    """(Re)initialise megatron-core's parallel groups for one case, on every spawned rank."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mcore_random

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    mcore_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def random_model_state(args: argparse.Namespace, seed: int = 0) -> OrderedDict:
    """``state_dict_for_save_checkpoint()`` of a TP=1 GPTModel with every parameter random (this process,
    gloo world of 1). Values are scaled normals, distinct per parameter."""
    import torch

    ensure_single_rank_world()
    with cpu_megatron():
        model = build_rank_model(args)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, param in model.named_parameters():
                param.copy_(torch.randn(param.shape, generator=gen) / max(1, param.shape[-1]) ** 0.5)
        return OrderedDict((k, v.clone() if isinstance(v, torch.Tensor) else v)
                           for k, v in model.state_dict_for_save_checkpoint().items())


def common_state(args: argparse.Namespace) -> dict:
    """What megatron.training.checkpointing puts next to the model (goes to common.pt)."""
    return {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}


def save_dist(state: OrderedDict, args: argparse.Namespace, iter_dir: Path) -> Path:
    """megatron-core ``dist_checkpointing.save`` of a TP=1 GPTModel holding ``state`` (this process)."""
    from megatron.core import dist_checkpointing

    ensure_single_rank_world()
    with cpu_megatron():
        model = build_rank_model(args)
        model.load_state_dict(state, strict=True)
        Path(iter_dir).mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save({**common_state(args), "model": model.sharded_state_dict()}, str(iter_dir))
    return Path(iter_dir)


def rank_dir(tp_rank: int, pp_rank: int, pp: int, ep_rank: int = 0, ep: int = 1) -> str:
    """``mp_rank_TT[_PPP][_EEE]``, spelled here independently of the code under test."""
    name = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name if ep == 1 else f"{name}_{ep_rank:03d}"


def run_reference_cases(rank: int, world_size: int, out: str, init_file: str, build_case) -> None:
    """Body of a spawned rank: for each case of ``out/job.json``, ``build_case(case)`` prepares the
    parallel groups and returns ``(args, model, dist_dir)``; the model is NaN-filled (anything the
    load misses shows up), loaded by megatron-core from ``dist_dir`` (which reshards), and its
    ``state_dict_for_save_checkpoint()`` saved as ``out/<case>/<mp_rank dir>/reference.pt``."""
    import warnings

    warnings.filterwarnings("ignore")
    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    import torch
    import torch.distributed as dist

    # A tied last pipeline stage moves its embedding copy to cuda before the all-reduce that fills it.
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    from megatron.core import dist_checkpointing, parallel_state

    job = json.loads((Path(out) / JOB_FILE).read_text())
    for case in job["cases"]:
        args, model, dist_dir = build_case(case, job["dist_dirs"])
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, dist_dir)
        model.load_state_dict(loaded["model"], strict=True)
        target = Path(out) / case["name"] / rank_dir(
            parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank(),
            case["pp"], parallel_state.get_expert_model_parallel_rank(), case.get("ep", 1))
        target.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict_for_save_checkpoint(), "args": args}, target / "reference.pt")
        dist.barrier()
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def spawn_references(rank_fn, dist_dirs: dict[str, Path], out: Path, cases) -> Path:
    """Write the job file and run ``rank_fn`` (a module-level wrapper of ``run_reference_cases``) on 2 gloo ranks."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / JOB_FILE).write_text(json.dumps({"dist_dirs": {k: str(v) for k, v in dist_dirs.items()},
                                            "cases": list(cases)}))
    _spawn(rank_fn, out, world_size=2)
    return out


def _dense_case(case: dict, dist_dirs: dict[str, str]):
    args = tiny_args(case["tied"], tensor_model_parallel_size=case["tp"],
                     pipeline_model_parallel_size=case["pp"], **case.get("args", {}))
    prepare_parallel(case["tp"], case["pp"])
    return args, build_rank_model(args), dist_dirs[case.get("variant") or ("tied" if case["tied"] else "untied")]


def _references_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    run_reference_cases(rank, world_size, out, init_file, _dense_case)


def rank_references(dist_dirs: dict[str, Path], out: Path, cases: tuple[dict, ...] = CASES) -> Path:
    """Per-rank references for ``cases`` from torch_dist dirs ``{"untied": ..., "tied": ...}`` (2 gloo ranks)."""
    return spawn_references(_references_rank, dist_dirs, out, cases)


def write_all(out: Path) -> Path:
    """Both variants' torch_dist dirs (megatron-core's own save) and every case's references."""
    out = Path(out) / "mcore_rank_refs"
    dist_dirs = {}
    for variant in ("untied", "tied"):
        args = tiny_args(variant == "tied")
        dist_dirs[variant] = save_dist(random_model_state(args), args, out / f"dist_{variant}")
    return rank_references(dist_dirs, out / "references")


WRITERS = {"mcore_rank_refs": write_all}


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
