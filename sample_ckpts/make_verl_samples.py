#!/usr/bin/env python
"""Write tiny verl checkpoints the way verl's checkpoint managers do, with the real writers.

    python sample_ckpts/make_verl_samples.py [OUT_DIR]      # default: sample_ckpts/

* ``verl_run/``: a verl experiment dir (``latest_checkpointed_iteration.txt`` = 2 and
  ``global_step_2/actor/``) as ``FSDPCheckpointManager.save_checkpoint`` writes it (FORMATS.md §6.1):
  a tiny transformers Llama wrapped with FSDP2 ``fully_shard`` (per decoder layer, then the root) on
  a 1-D ``("fsdp",)`` mesh of 2 gloo ranks, one AdamW step, then per rank
  ``torch.save(model.state_dict())`` (DTensor values) to ``model_world_size_2_rank_{r}.pt``, the
  optimizer state to ``optim_…``, ``{"lr_scheduler", "rng"}`` to ``extra_state_…``, and on rank 0
  ``fsdp_config.json`` and ``huggingface/`` (config, generation config, tokenizer). The vocabulary
  (37 rows) does not divide by 2, so embedding and lm_head shards are uneven (19 + 18 rows).

Only for tests (written into temporary dirs, not shipped):

* ``write_verl_hsdp_and_fsdp1``: on 4 ranks, the same with an HSDP ``("ddp", "fsdp")`` 2x2 mesh
  (placements ``(Replicate(), Shard(0))``), and FSDP1 with ``SHARDED_STATE_DICT`` and no device
  mesh (``ShardedTensor`` values).
* ``write_verl_megatron_actor``: verl's pre-v2 Megatron layout (``dist_ckpt/`` + ``huggingface/``)
  around a megatron-core torch_dist dir written by ``make_dist_samples.write_megatron_torch_dist``
  (layout schema v2: make_verl_v2_samples.py).

With ``oracle=True`` rank 0 also ``torch.save``s ``{name: full tensor}`` (``DTensor.full_tensor()``,
or FSDP1's ``FULL_STATE_DICT``) next to the run dir, as ground truth for tests.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this module by name

from make_dist_samples import _init_gloo, _spawn

STEP = 2
VERL_LLAMA = {"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "vocab_size": 37, "max_position_embeddings": 64, "tie_word_embeddings": False}
"""vocab_size 37 is odd: dim-0 shards of embed_tokens / lm_head are uneven on 2 and 4 ranks."""


def oracle_path(run: Path) -> Path:
    """Where ``oracle=True`` puts the gathered full state dict of ``run`` (outside the run dir)."""
    return run.parent / f"{run.name}.full_state_dict.pt"


def _tiny_model(tied: bool = False):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(21)
    return LlamaForCausalLM(LlamaConfig(**{**VERL_LLAMA, "tie_word_embeddings": tied})).float()


def _train_step(model, optimizer, scheduler) -> None:
    import torch

    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VERL_LLAMA["vocab_size"], (2, 8), generator=gen)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _rng_state() -> dict:
    """verl's ``BaseCheckpointManager.get_rng_state`` on a CPU-only node."""
    import random

    import numpy as np
    import torch

    return {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}


def _save_like_verl(actor: Path, rank: int, world: int, model, optimizer, scheduler, fsdp_version: int,
                    model_state: dict, optim_state: dict, vocab_size: int = VERL_LLAMA["vocab_size"]) -> None:
    """``FSDPCheckpointManager.save_checkpoint``: three files per rank, config + HF dir on rank 0."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        actor.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    torch.save(model_state, actor / f"model_world_size_{world}_rank_{rank}.pt")
    torch.save(optim_state, actor / f"optim_world_size_{world}_rank_{rank}.pt")
    torch.save({"lr_scheduler": scheduler.state_dict(), "rng": _rng_state()},
               actor / f"extra_state_world_size_{world}_rank_{rank}.pt")
    if rank == 0:
        (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": fsdp_version, "world_size": world},
                                                           indent=4))
        hf = actor / "huggingface"
        model.config.save_pretrained(hf)
        model.generation_config.save_pretrained(hf)
        _tokenizer(vocab_size).save_pretrained(hf)
    dist.barrier()


def _tokenizer(vocab_size: int = VERL_LLAMA["vocab_size"]):
    """A word-level tokenizer over the model's vocabulary (verl saves the tokenizer with the config)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _optimizer(model):
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    return optimizer, scheduler


def _write_tracker(root: Path) -> None:
    """verl's trainer writes the tracker after every rank has saved (``ray_trainer._save_checkpoint``)."""
    (root / "latest_checkpointed_iteration.txt").write_text(str(STEP))


# --- FSDP2 (the verl default, 1-D mesh or HSDP) and FSDP1 -------------------------------------------


def _save_fsdp2(rank: int, world_size: int, root: Path, *, hsdp: bool, oracle: bool, tied: bool = False) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = _tiny_model(tied)
    if hsdp:  # verl fsdp_workers: mesh ("ddp", "fsdp") when fsdp_size < world size
        mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("ddp", "fsdp"))
    else:
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("fsdp",))
    for layer in model.model.layers:  # verl apply_fsdp2: every _no_split_modules block, then the root
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer, scheduler = _optimizer(model)
    _train_step(model, optimizer, scheduler)
    model_state = model.state_dict()
    _save_like_verl(root / f"global_step_{STEP}" / "actor", rank, world_size, model, optimizer, scheduler, 2,
                    model_state, optimizer.state_dict())
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model_state.items()}  # collective
    if rank == 0:
        _write_tracker(root)
        if oracle:
            torch.save(full, oracle_path(root))


def _save_fsdp1(rank: int, world_size: int, root: Path, *, oracle: bool) -> None:
    """FSDP1 ``SHARDED_STATE_DICT`` without a device mesh: ShardedTensor values (FORMATS.md §6.1)."""
    import functools
    import warnings

    import torch
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    warnings.filterwarnings("ignore")
    model = _tiny_model()
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    fsdp = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=False)
    optimizer, scheduler = _optimizer(fsdp)
    _train_step(fsdp, optimizer, scheduler)
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        model_state = fsdp.state_dict()
        optim_state = optimizer.state_dict()
    _save_like_verl(root / f"global_step_{STEP}" / "actor", rank, world_size, model, optimizer, scheduler, 1,
                    model_state, optim_state)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        full = fsdp.state_dict()
    if rank == 0:
        _write_tracker(root)
        if oracle:
            torch.save(full, oracle_path(root))


LORA = {"r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
"""The LoRA of ``verl_lora``: PEFT's ``LoraConfig`` as verl builds it from ``lora_rank`` / ``lora_alpha``."""


def _save_fsdp2_lora(rank: int, world_size: int, root: Path, *, lora_only: bool, oracle: bool = False) -> None:
    """verl's LoRA actor (``model.lora_rank > 0``): the model wrapped by PEFT, then FSDP2, and the optimizer
    over every parameter (frozen base weights get no gradient, so AdamW leaves them as they are). Saved at
    steps 1 and 2 as ``FSDPCheckpointManager.save_checkpoint`` does: PEFT's names in the rank files
    (``base_model.model.<name>`` with ``.base_layer`` / ``.lora_A.default``), only the ``lora_`` keys under
    ``checkpoint.save_lora_only``, and ``lora_train_meta.json`` (r, lora_alpha, task_type) on rank 0. With
    ``oracle``, the last step's whole state dict (PEFT's names) is gathered to ``oracle_path(root)``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = get_peft_model(_tiny_model(), LoraConfig(task_type="CAUSAL_LM", **LORA))
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("fsdp",))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer, scheduler = _optimizer(model)
    for step in (1, 2):
        _train_step(model, optimizer, scheduler)
        model_state = model.state_dict()
        if lora_only:
            model_state = {k: v for k, v in model_state.items() if "lora_" in k or ".adapter_" in k}
        actor = root / f"global_step_{step}" / "actor"
        _save_like_verl(actor, rank, world_size, model.base_model.model, optimizer, scheduler, 2,
                        model_state, optimizer.state_dict())
        if rank == 0:
            (actor / "lora_train_meta.json").write_text(json.dumps(
                {"r": LORA["r"], "lora_alpha": LORA["lora_alpha"], "task_type": "CAUSAL_LM"}, indent=4))
            (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    if oracle:
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}  # collective
        if rank == 0:
            torch.save(full, oracle_path(root))


def _run_rank(rank: int, world_size: int, out: str, init_file: str, *, jobs: tuple[str, ...], oracle: bool) -> None:
    _init_gloo(rank, world_size, init_file)
    import torch

    for job in jobs:
        if job in ("verl_lora", "verl_lora_only"):
            _save_fsdp2_lora(rank, world_size, Path(out) / job, lora_only=job == "verl_lora_only",
                             oracle=oracle and job == "verl_lora")
        elif job == "fsdp1":
            _save_fsdp1(rank, world_size, Path(out) / "verl_fsdp1", oracle=oracle)
        else:
            _save_fsdp2(rank, world_size, Path(out) / job, hsdp=job == "verl_hsdp", oracle=oracle,
                        tied=job == "verl_tied")
    torch.distributed.barrier()  # no rank tears the group down while another still talks to it
    torch.distributed.destroy_process_group()


def write_verl_run(out: Path, *, oracle: bool = False) -> Path:
    """The shipped sample: verl experiment dir, FSDP2 actor on 2 ranks, uneven vocab shards."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(functools.partial(_run_rank, jobs=("verl_run",), oracle=oracle), out, world_size=2)
    return out / "verl_run"


def write_verl_tied(out: Path, *, oracle: bool = False) -> Path:
    """The same FSDP2 run of a model whose config ties the embeddings: ``model.state_dict()`` holds
    ``lm_head.weight`` and ``model.embed_tokens.weight``, one parameter saved under both names."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(functools.partial(_run_rank, jobs=("verl_tied",), oracle=oracle), out, world_size=2)
    return out / "verl_tied"


def write_verl_lora(out: Path, *, oracle: bool = False) -> tuple[Path, Path]:
    """Two LoRA runs on 2 ranks, saved at steps 1 and 2: ``verl_lora/`` (base weights and adapter in the
    rank files; with ``oracle`` its last state gathered whole beside it) and ``verl_lora_only/``
    (``checkpoint.save_lora_only``: the adapter alone)."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(functools.partial(_run_rank, jobs=("verl_lora", "verl_lora_only"), oracle=oracle), out, world_size=2)
    return out / "verl_lora", out / "verl_lora_only"


def write_verl_hsdp_and_fsdp1(out: Path, *, oracle: bool = False) -> tuple[Path, Path]:
    """Two runs from one group of 4 ranks (one spawn, to keep tests fast): ``verl_hsdp/`` (FSDP2 on a
    2x2 ("ddp", "fsdp") mesh, every shard stored twice) and ``verl_fsdp1/`` (FSDP1 ShardedTensors)."""
    out.mkdir(parents=True, exist_ok=True)
    _spawn(functools.partial(_run_rank, jobs=("verl_hsdp", "fsdp1"), oracle=oracle), out, world_size=4)
    return out / "verl_hsdp", out / "verl_fsdp1"


# --- Megatron backend ---------------------------------------------------------------------------------


def write_verl_megatron_actor(out: Path, dist_ckpt: Path) -> Path:
    """verl ``MegatronCheckpointManager`` pre-v2 layout (``actor/{dist_ckpt,huggingface}``) around a
    megatron-core torch_dist dir; layout schema v2 is make_verl_v2_samples.py.

    ``transformer_config.json`` and the HF config/tokenizer are written by transformers as verl
    does; the tensors are megatron-core's own files.
    """
    from transformers import LlamaConfig

    actor = out / f"global_step_{STEP}" / "actor"
    shutil.copytree(dist_ckpt, actor / "dist_ckpt")
    from make_dist_samples import TINY_GPT, VOCAB

    config = LlamaConfig(hidden_size=TINY_GPT["hidden_size"], intermediate_size=TINY_GPT["ffn_hidden_size"],
                         num_hidden_layers=TINY_GPT["num_layers"], num_attention_heads=TINY_GPT["num_attention_heads"],
                         num_key_value_heads=TINY_GPT["num_query_groups"], vocab_size=VOCAB,
                         tie_word_embeddings=True)
    config.save_pretrained(actor / "huggingface")
    _tokenizer().save_pretrained(actor / "huggingface")
    (actor / "transformer_config.json").write_text(json.dumps({**TINY_GPT, "params_dtype": "torch.bfloat16",
                                                                "tensor_model_parallel_size": 2}, indent=2))
    _write_tracker(out)
    return actor


def migrate_like_verl(actor: Path) -> Path:
    """What verl's ``scripts/migrate_megatron_checkpoint_layout.py`` (default hard-link mode) leaves of a
    pre-v2 actor dir: every file of ``dist_ckpt/`` hard-linked into ``model/``, ``optimizer/`` and
    ``extra/dist_ckpt`` (one mixed tree mirrored three times; ``dist_ckpt/`` itself stays), ``huggingface/``
    moved to ``model/huggingface``, and no ``ckpt_contents.json`` (the script writes none)."""
    import os

    for target in ("optimizer", "extra", "model"):
        for src in sorted((actor / "dist_ckpt").rglob("*")):
            dst = actor / target / "dist_ckpt" / src.relative_to(actor / "dist_ckpt")
            if src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(src, dst)
    if (actor / "huggingface").is_dir():
        (actor / "huggingface").rename(actor / "model" / "huggingface")
    return actor


WRITERS = {
    "verl_run": write_verl_run,
}


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
