#!/usr/bin/env python
"""Write the tiny distributed-checkpoint samples ckptscope ships and tests against, with the real writers.

    python sample_ckpts/make_dist_samples.py [OUT_DIR]      # default: sample_ckpts/

* ``megatron_torch_dist/``: a Megatron save root (``latest_checkpointed_iteration.txt`` +
  ``iter_0000010/``) written by megatron-core ``dist_checkpointing.save`` from a tiny GPTModel on
  2 CPU ranks (gloo, TP=2), with Adam state keyed the way Megatron's non-distributed optimizer does
  and the ``args``/``iteration``/``checkpoint_version`` common state Megatron training writes.
* ``dcp_fsdp2/``: ``torch.distributed.checkpoint.save`` of an FSDP2 (``fully_shard``) model on 2
  gloo ranks: uneven row shards and a replicated DTensor.
* ``dcp_nested/``: a single-process DCP save of ``{"model": ..., "optimizer": ..., "step": ...}``.
* ``dcp_safetensors/``: the same kind of state saved with ``SerializationFormat.SAFETENSORS``.

megatron-core 0.16 calls a few ``torch.cuda`` functions on its save path even on CPU; they are
stubbed *in this generator only* (FORMATS.md §11). Nothing about the files depends on it.
Tests call these functions into a temporary directory, so fixtures never drift from the writers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

MEGATRON_ITERATION = 10
TINY_GPT = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2}
VOCAB = 256
SEQ = 32


# --- helpers shared by the multi-rank writers --------------------------------------------------


def _spawn(fn, out: Path, world_size: int = 2) -> None:
    """Run ``fn(rank, world_size, out, init_file)`` on ``world_size`` CPU processes (gloo)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        # The ranks, and the workers they start, keep their temp files under ``tmp`` and so go
        # with it: megatron-core's async-save worker is terminated (``_end_children``) and never
        # removes its own multiprocessing /tmp/pymp-* directory.
        saved = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = tmp
        try:
            mp.spawn(_run_then_exit, args=(fn, world_size, str(out), init_file), nprocs=world_size, join=True)
        finally:
            if saved is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved


def _run_then_exit(rank: int, fn, world_size: int, out: str, init_file: str) -> None:
    """A rank that finished its work leaves at once: gloo's teardown at interpreter exit sometimes
    aborts a process (SIGABRT) on a loaded machine, which would fail a sample that was written whole.
    An exception in ``fn`` still reaches ``mp.spawn`` (it never gets here)."""
    fn(rank, world_size, out, init_file)
    sys.stdout.flush()
    sys.stderr.flush()
    _end_children()
    os._exit(0)


def _end_children() -> None:
    """Stop the processes a rank started (megatron-core's persistent async-save worker, spawned
    with multiprocessing): ``os._exit`` skips the shutdown that would stop them, and each one left
    behind waited forever, holding ~260 MB."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(5)
        if child.is_alive():
            child.kill()
    # multiprocessing's own clean-up (its /tmp/pymp-* directory and the sockets in it), which
    # os._exit would skip as it skips every exit handler.
    import multiprocessing.util

    multiprocessing.util._exit_function()


def _init_gloo(rank: int, world_size: int, init_file: str) -> None:
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)


def _stub_cuda() -> None:
    """megatron-core's async save path touches torch.cuda even for CPU tensors (FORMATS.md §11)."""
    import torch

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.device_count = lambda: 1


# --- Megatron-Core torch_dist --------------------------------------------------------------------


def _megatron_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    import torch
    import torch.nn.functional as F
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    torch.manual_seed(1234)
    config = TransformerConfig(
        **TINY_GPT, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        normalization="RMSNorm", use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
        tensor_model_parallel_size=world_size,
    )
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=VOCAB, max_sequence_length=SEQ, share_embeddings_and_output_weights=True,
                     position_embedding_type="rope")
    # Distinct, reproducible values per parameter, so misplaced chunks cannot go unnoticed.
    with torch.no_grad():
        for i, (_, param) in enumerate(sorted(model.named_parameters())):
            gen = torch.Generator().manual_seed(100 * i + rank)
            param.copy_(torch.randn(param.shape, generator=gen).to(param.dtype))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    loss = sum((p.float() ** 2).sum() for p in model.parameters())
    loss.backward()
    optimizer.step()

    sharded = model.sharded_state_dict()
    optim_state = optimizer.state_dict()
    optim_state_to_sharding_state(
        optim_state, get_param_id_to_sharded_param_map(sharded, model.parameters()), exclude_keys=("step",)
    )
    args = argparse.Namespace(
        num_layers=TINY_GPT["num_layers"], hidden_size=TINY_GPT["hidden_size"],
        ffn_hidden_size=TINY_GPT["ffn_hidden_size"], num_attention_heads=TINY_GPT["num_attention_heads"],
        num_query_groups=TINY_GPT["num_query_groups"], group_query_attention=True, swiglu=True,
        padded_vocab_size=VOCAB, seq_length=SEQ, max_position_embeddings=SEQ, normalization="RMSNorm",
        tensor_model_parallel_size=world_size, pipeline_model_parallel_size=1, bf16=True,
        untie_embeddings_and_output_weights=False, lr=3e-4, ckpt_format="torch_dist",
        iteration=MEGATRON_ITERATION, position_embedding_type="rope",
    )
    # As megatron.training.checkpointing saves rng state: one ShardedObject per (pp, tp) rank.
    import random

    import numpy as np

    rng_state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                  "torch_rng_state": torch.get_rng_state()}]
    rng = ShardedObject("rng_state", rng_state, (1, world_size), (0, rank), replica_id=0)
    # The shape of megatron.training.checkpointing.generate_state_dict: ShardedTensors under
    # "model"/"optimizer", everything else goes to common.pt.
    state = {
        "rng_state": rng,
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": MEGATRON_ITERATION,
        "model": sharded,
        "optimizer": optim_state,
        "num_floating_point_operations_so_far": 123456.0,
    }
    root = Path(out) / "megatron_torch_dist"
    ckpt_dir = root / f"iter_{MEGATRON_ITERATION:07d}"
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    dist_checkpointing.save(state, str(ckpt_dir))
    torch.distributed.barrier()
    if rank == 0:
        (root / "latest_checkpointed_iteration.txt").write_text(str(MEGATRON_ITERATION))
    torch.distributed.destroy_process_group()


def write_megatron_torch_dist(out: Path) -> Path:
    """Megatron save root with one torch_dist iteration dir (TP=2, 2 CPU ranks)."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(_megatron_rank, out)
    return out / "megatron_torch_dist"


# --- plain DCP -----------------------------------------------------------------------------------


def _fsdp2_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    _init_gloo(rank, world_size, init_file)
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, distribute_tensor

    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    mesh = init_device_mesh("cpu", (world_size,))
    fully_shard(model, mesh=mesh)  # Shard(0): 5 rows on 2 ranks -> 3 + 2, 3 rows -> 2 + 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    full = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {"model": model_sd, "optim": optim_sd,
             "extra": {"replicated": distribute_tensor(full, mesh, [Replicate()])},
             "train_state": {"step": 3, "tokens_seen": 4096}}
    dcp.save(state, checkpoint_id=os.path.join(out, "dcp_fsdp2"))
    torch.distributed.destroy_process_group()


def write_dcp_fsdp2(out: Path) -> Path:
    """FSDP2 DCP dir from 2 gloo ranks: uneven Shard(0) chunks, a replicated DTensor, optimizer."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(_fsdp2_rank, out)
    return out / "dcp_fsdp2"


def nested_state() -> dict:
    """The state saved by ``write_dcp_nested`` (deterministic: tests compare against it)."""
    import torch

    torch.manual_seed(11)
    model = torch.nn.ModuleDict({
        "embed": torch.nn.Embedding(10, 4),
        "layers": torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)]),
    })
    model = model.to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model["layers"][0](model["embed"](torch.tensor([1, 2]))).float().sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 5,
            "counts": torch.arange(6, dtype=torch.int64)}


def write_dcp_nested(out: Path) -> Path:
    """Single-process DCP of a nested model + optimizer state dict (planner_data populated)."""
    import torch.distributed.checkpoint as dcp

    target = out / "dcp_nested"
    dcp.save(nested_state(), checkpoint_id=str(target), no_dist=True)
    return target


def safetensors_state() -> dict:
    """The state saved by ``write_dcp_safetensors`` (deterministic: tests compare against it)."""
    import torch

    torch.manual_seed(13)
    return {"model": {"w": torch.randn(3, 4), "b": torch.randn(4).half()}, "step": 2}


def write_dcp_safetensors(out: Path) -> Path:
    """Single-process DCP written with ``SerializationFormat.SAFETENSORS`` (.distcp are safetensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

    target = out / "dcp_safetensors"
    writer = FileSystemWriter(str(target), serialization_format=SerializationFormat.SAFETENSORS)
    dcp.save(safetensors_state(), storage_writer=writer, no_dist=True)
    return target


def hf_storage_state() -> dict:
    """The full tensors ``write_hf_storage_shards`` saves (deterministic: tests compare against them)."""
    import torch

    torch.manual_seed(17)
    return {"model.embed_tokens.weight": torch.randn(5, 4), "lm_head.weight": torch.randn(5, 4).bfloat16(),
            "model.layers.0.mlp.down_proj.weight": torch.randn(4, 6), "model.norm.weight": torch.randn(4)}


def _hf_storage_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    _init_gloo(rank, world_size, init_file)
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    placements = {"model.layers.0.mlp.down_proj.weight": Shard(1), "model.norm.weight": Replicate()}
    state = {name: distribute_tensor(full, mesh, [placements.get(name, Shard(0))])  # 5 rows: 3 + 2
             for name, full in hf_storage_state().items()}
    writer = HuggingFaceStorageWriter(os.path.join(out, "hf_storage_shards"), save_distributed=True)
    dcp.save(state, storage_writer=writer)
    torch.distributed.destroy_process_group()


def write_hf_storage_shards(out: Path) -> Path:
    """torch's ``HuggingFaceStorageWriter(save_distributed=True)`` from 2 gloo ranks, no consolidation:
    ``shard-0000R-model-00001-of-00001.safetensors`` per rank, each with its local pieces and their
    global offsets in ``__metadata__["DCP_SHARDING_INFO"]`` (uneven Shard(0), a Shard(1), a replicated
    tensor, a bf16 one). Not a shipped sample: tests write it."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(_hf_storage_rank, out)
    return out / "hf_storage_shards"


def _fsdp_rank_files_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    _init_gloo(rank, world_size, init_file)
    import torch
    from torch import nn
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, ShardedStateDictConfig
    from torch.distributed.fsdp import StateDictType, fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def model() -> nn.Module:
        torch.manual_seed(23)
        return nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 9), nn.Linear(9, 5, bias=False))

    # FSDP1, SHARDED_STATE_DICT: ShardedTensor values (CPU needs offload_to_cpu=False)
    fsdp1 = FullyShardedDataParallel(model(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                                     device_id=torch.device("cpu"), use_orig_params=True)
    with FullyShardedDataParallel.state_dict_type(fsdp1, StateDictType.SHARDED_STATE_DICT,
                                                  ShardedStateDictConfig(offload_to_cpu=False)):
        torch.save(fsdp1.state_dict(), os.path.join(out, "fsdp1", f"model_rank{rank}.pt"))
    with FullyShardedDataParallel.state_dict_type(fsdp1, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(offload_to_cpu=False, rank0_only=True)):
        full = fsdp1.state_dict()
    if rank == 0:
        torch.save(full, os.path.join(out, "fsdp1", "full.pt"))
    # FSDP2 (fully_shard): DTensor values
    fsdp2 = model()
    for layer in fsdp2:
        fully_shard(layer)
    fully_shard(fsdp2)
    torch.save(fsdp2.state_dict(), os.path.join(out, "fsdp2", f"model_world_size_{world_size}_rank_{rank}.pt"))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def write_fsdp_rank_files(out: Path) -> Path:
    """Per-rank ``torch.save`` of a sharded state dict from 2 gloo ranks, as training scripts write
    them: ``fsdp1/model_rank{R}.pt`` (FSDP1 SHARDED_STATE_DICT: ShardedTensor values) with FSDP1's own
    FULL_STATE_DICT ``fsdp1/full.pt``, and ``fsdp2/model_world_size_2_rank_{R}.pt`` (fully_shard:
    DTensor values) of the same model. Not a shipped sample: tests write it."""
    for sub in ("fsdp1", "fsdp2"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    _spawn(_fsdp_rank_files_rank, out)
    return out


WRITERS = {
    "megatron_torch_dist": write_megatron_torch_dist,
    "dcp_fsdp2": write_dcp_fsdp2,
    "dcp_nested": write_dcp_nested,
    "dcp_safetensors": write_dcp_safetensors,
}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
