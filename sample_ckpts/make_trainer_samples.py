#!/usr/bin/env python
"""Write tiny checkpoints the way the Hugging Face trainers write them, with the real writers.

    python sample_ckpts/make_trainer_samples.py [OUT_DIR]      # default: sample_ckpts/

Every layout holds one tiny Llama (``TINY_TRAINER_LLAMA``: hidden 32, 2 layers, 4 heads, 2 KV heads,
intermediate 64, vocab 128, float32, 26,784 parameters untied) next to the training state a trainer
keeps beside it, so a reader has to tell the model's weights apart from that state (FORMATS.md §9.4).

* ``hf_trainer_run/``: a transformers ``Trainer`` ``output_dir`` after a real CPU run of 4 optimizer
  steps (AdamW, linear schedule, ``save_steps=2``, ``report_to="none"``, ``use_cpu=True``) on 8 random
  sequences: ``checkpoint-2/`` and ``checkpoint-4/``, each exactly as ``Trainer._save_checkpoint``
  writes it: ``model.safetensors`` + ``config.json`` + ``generation_config.json`` (``save_model``),
  ``optimizer.pt`` (AdamW ``state_dict()``: ``state.N.{exp_avg,exp_avg_sq,step}`` and
  ``param_groups``), ``scheduler.pt``, ``rng_state.pth`` (python / numpy / cpu RNG states),
  ``training_args.bin`` (a pickled ``TrainingArguments``: not ``weights_only``-loadable), and
  ``trainer_state.json``, which ``_save_checkpoint`` writes after everything else (the marker of a
  complete checkpoint).  No tracker file: the newest ``checkpoint-N`` is the latest.
* ``hf_tied_safetensors/``: ``save_pretrained`` of a Llama with ``tie_word_embeddings=True``:
  ``model.safetensors`` holds ``model.embed_tokens.weight`` and no ``lm_head.weight`` (transformers
  drops tied aliases before writing safetensors).
* ``hf_tied_bin/``: the same weights in the pre-safetensors layout, ``pytorch_model.bin``. transformers
  5 no longer writes it (``save_pretrained`` has no ``safe_serialization`` parameter any more and
  silently writes ``model.safetensors`` when given ``safe_serialization=False``), so this does what
  transformers 4.x ``save_pretrained(safe_serialization=False)`` did: huggingface_hub's
  ``split_torch_state_dict_into_shards`` over the full ``state_dict()`` and one ``torch.save`` of
  ``{name: tensor.contiguous()}`` per shard (one shard here). The tied-alias removal in 4.x ran only
  for safetensors, so the file keeps **both** ``model.embed_tokens.weight`` and ``lm_head.weight``,
  pickled as two views of one storage. Config and generation config come from transformers.
* ``accelerate_fsdp2/``: ``Accelerator.save_state`` (accelerate 1.x) of an FSDP2 run with
  ``FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")`` on 2 CPU
  gloo ranks, after 2 real optimizer steps through ``Accelerator.prepare`` / ``backward``:
  ``pytorch_model_fsdp_0/`` (accelerate's ``save_fsdp_model``: a DCP save of
  ``{"model": model_state_dict}``, so tensors are named ``model.model.embed_tokens.weight``,
  ``model.lm_head.weight``, ... with Shard(0) chunks from both ranks), ``optimizer_0/`` (DCP of
  ``{"optimizer": get_optimizer_state_dict(...)}``: ``optimizer.state.<fqn>.exp_avg`` ...),
  ``scheduler.bin`` and ``random_states_{0,1}.pkl``. Everything on disk is written by accelerate's
  own code. The one liberty: accelerate only turns on FSDP for accelerator-device process groups
  (``MULTI_GPU``, ``MULTI_NPU``, ...), never ``MULTI_CPU``, so after ``Accelerator(cpu=True,
  fsdp_plugin=...)`` this generator sets ``distributed_type = DistributedType.FSDP`` in accelerate's
  shared state (``PartialState`` and ``AcceleratorState``); ``prepare`` then runs ``fully_shard`` per
  decoder layer and on the root exactly as on GPUs.
* ``accelerate_fsdp2_ranks/``: the same model and optimizer saved by accelerate's ``save_fsdp_model`` /
  ``save_fsdp_optimizer`` with ``use_dcp=False``: one ``torch.save`` per rank of its sharded state dict,
  ``pytorch_model_fsdp_0_rank{0,1}.bin`` (DTensor values) and ``optimizer_0_rank{0,1}.bin``.

Reference weights (``reference=True``, for tests; written outside the sample dirs, see
``reference_dir``): ``hf_trainer_run_ref/checkpoint-N.safetensors`` (the model's ``state_dict()`` as the
Trainer's ``on_save`` callback sees it), ``accelerate_fsdp2_ref/`` (``model.safetensors`` with each
DTensor's ``full_tensor()`` + the tiny ``config.json`` / ``generation_config.json``, usable as
``--hf-config``). ``tied_state()`` rebuilds the tied model's weights in-process.

Reproducibility: every tensor file and RNG state is byte-identical between runs (fixed seeds, CPU, one
thread per process); only files that pickle the output path or a fresh id differ:
``training_args.bin`` (``output_dir``) and the DCP ``.metadata`` files (``StorageMeta`` checkpoint_id
and save_id).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import this module by name

from make_dist_samples import _init_gloo, _spawn

TINY_TRAINER_LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
SAVE_STEPS = 2
MAX_STEPS = 4
SEQ = 16
ACCELERATE_STEPS = 2
ACCELERATE_WORLD = 2
ACCELERATE_RANKS = "accelerate_fsdp2_ranks"
"""Beside ``accelerate_fsdp2/``: the same state saved per rank with ``use_dcp=False``."""


def reference_dir(sample: Path) -> Path:
    """Where ``reference=True`` puts the reference weights of ``sample`` (a sibling dir, never inside it)."""
    return sample.parent / f"{sample.name}_ref"


def tiny_config(**overrides):
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_TRAINER_LLAMA, **overrides})


def tiny_model(seed: int = 0, **overrides):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(**overrides)).float()


def _clone_state(state: dict) -> dict:
    return {name: tensor.detach().clone().contiguous() for name, tensor in state.items()}


def load_reference(path: Path) -> dict:
    """A reference ``.safetensors`` as ``{name: torch.Tensor}``."""
    from safetensors.torch import load_file

    return load_file(str(path))


# --- transformers Trainer --------------------------------------------------------------------------


def _random_dataset(n: int = 8) -> list[dict]:
    import torch

    gen = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, TINY_TRAINER_LLAMA["vocab_size"], (SEQ,), generator=gen)
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return rows


def write_hf_trainer_run(out: Path, *, reference: bool = False) -> Path:
    """A real ``Trainer.train()`` on CPU with ``checkpoint-2/`` and ``checkpoint-4/`` under ``output_dir``."""
    import torch
    from safetensors.torch import save_file
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.utils import logging as hf_logging

    target = out / "hf_trainer_run"
    ref = reference_dir(target)

    class SaveReference(TrainerCallback):
        """Called right after ``_save_checkpoint``: the weights that checkpoint holds."""

        def on_save(self, args, state, control, model=None, **kwargs):
            if reference:
                ref.mkdir(parents=True, exist_ok=True)
                save_file(_clone_state(model.state_dict()), str(ref / f"checkpoint-{state.global_step}.safetensors"))

    args = TrainingArguments(
        output_dir=str(target), max_steps=MAX_STEPS, save_strategy="steps", save_steps=SAVE_STEPS,
        per_device_train_batch_size=2, learning_rate=1e-2, lr_scheduler_type="linear", logging_steps=1,
        report_to="none", use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    threads, verbosity = torch.get_num_threads(), hf_logging.get_verbosity()
    torch.set_num_threads(1)  # reproducible float sums; restored below (tests run this in-process)
    hf_logging.set_verbosity_error()
    try:
        trainer = Trainer(model=tiny_model(seed=0), args=args, train_dataset=_random_dataset(),
                          callbacks=[SaveReference()])
        trainer.train()
    finally:
        torch.set_num_threads(threads)
        hf_logging.set_verbosity(verbosity)
    return target


# --- tied embeddings: save_pretrained (safetensors) and the transformers 4.x pytorch_model.bin -------


def tied_model():
    """The tied-embedding Llama both ``hf_tied_*`` samples hold (deterministic)."""
    return tiny_model(seed=3, tie_word_embeddings=True)


def tied_state() -> dict:
    """``tied_model().state_dict()`` cloned: both ``model.embed_tokens.weight`` and ``lm_head.weight``."""
    return _clone_state(tied_model().state_dict())


def write_hf_tied_safetensors(out: Path) -> Path:
    """``save_pretrained`` (transformers 5): ``model.safetensors`` without the tied ``lm_head.weight``."""
    target = out / "hf_tied_safetensors"
    tied_model().save_pretrained(target)
    return target


def write_hf_tied_bin(out: Path) -> Path:
    """What transformers 4.x ``save_pretrained(safe_serialization=False)`` wrote: ``pytorch_model.bin``
    with both tied names sharing one storage, + ``config.json`` and ``generation_config.json``."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    model = tied_model()
    target = out / "hf_tied_bin"
    target.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    split = split_torch_state_dict_into_shards(state, filename_pattern="pytorch_model{suffix}.bin",
                                               max_shard_size="5GB")
    for filename, names in split.filename_to_tensors.items():
        torch.save({name: state[name].contiguous() for name in names}, target / filename)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (target / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    model.config.save_pretrained(target)
    model.generation_config.save_pretrained(target)
    return target


# --- accelerate FSDP2 save_state ---------------------------------------------------------------------


def _accelerate_rank(rank: int, world_size: int, out: str, init_file: str, *, reference: bool) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    _init_gloo(rank, world_size, init_file)  # accelerate finds the group initialised and keeps it
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1")
    import torch
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, set_seed

    torch.set_num_threads(1)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    # accelerate enables FSDP only on accelerator-device groups; on a CPU group it says MULTI_CPU and
    # drops the plugin. Make it FSDP in both shared states (AcceleratorState re-reads PartialState's).
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    assert accelerator.distributed_type == DistributedType.FSDP and accelerator.is_fsdp2

    set_seed(0)  # python / numpy / torch: random_states_{rank}.pkl is reproducible too
    model = tiny_model(seed=0)  # same init on every rank, as from_pretrained gives
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch, as a sharded sampler gives
    for _ in range(ACCELERATE_STEPS):
        ids = torch.randint(0, TINY_TRAINER_LLAMA["vocab_size"], (2, SEQ), generator=gen)
        accelerator.backward(model(input_ids=ids, labels=ids).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    target = Path(out) / "accelerate_fsdp2"
    accelerator.save_state(str(target))
    accelerator.wait_for_everyone()
    # The same state as accelerate's per-rank torch.save files (save_fsdp_model / save_fsdp_optimizer with
    # use_dcp=False): pytorch_model_fsdp_0_rank{R}.bin, optimizer_0_rank{R}.bin
    from accelerate.utils.fsdp_utils import save_fsdp_model, save_fsdp_optimizer

    per_rank = Path(out) / ACCELERATE_RANKS
    save_fsdp_model(plugin, accelerator, model, str(per_rank), 0, use_dcp=False)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, str(per_rank), 0, use_dcp=False)
    accelerator.wait_for_everyone()
    full = {name: value.full_tensor() if hasattr(value, "full_tensor") else value
            for name, value in model.state_dict().items()}  # collective: every rank takes part
    if reference and rank == 0:
        from safetensors.torch import save_file

        ref = reference_dir(target)
        ref.mkdir(parents=True, exist_ok=True)
        save_file(_clone_state(full), str(ref / "model.safetensors"), metadata={"format": "pt"})
        config = tiny_config()
        config.save_pretrained(ref)
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(config).save_pretrained(ref)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def write_accelerate_fsdp2(out: Path, *, reference: bool = False) -> Path:
    """``Accelerator.save_state`` with FSDP2 SHARDED_STATE_DICT from 2 gloo ranks (DCP dirs + states)."""
    # Imported by module name, so the function pickled for the spawned ranks is the one they import
    # (this file may have been loaded from its path, as tests/conftest.py's load_sample_module does).
    from make_trainer_samples import _accelerate_rank as rank_fn

    out.mkdir(parents=True, exist_ok=True)
    _spawn(functools.partial(rank_fn, reference=reference), out, world_size=ACCELERATE_WORLD)
    return out / "accelerate_fsdp2"


def _trainer_fsdp2_rank(rank: int, world_size: int, out: str, init_file: str, *, full: bool = False) -> None:
    """``Trainer.train()`` under FSDP2 with ``SHARDED_STATE_DICT``, or with ``full`` ``FULL_STATE_DICT`` and tied
    embeddings (see ``write_hf_trainer_fsdp2``)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    _init_gloo(rank, world_size, init_file)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1")
    import accelerate
    import torch
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    from safetensors.torch import save_file
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    plain_init = accelerate.Accelerator.__init__

    def fsdp_on_cpu(self, *args, **kwargs):  # the liberty the module docstring describes, inside the Trainer
        plain_init(self, *args, **kwargs)
        plugin = AcceleratorState._shared_state.get("fsdp_plugin") or kwargs.get("fsdp_plugin")
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
        AcceleratorState._shared_state["fsdp_plugin"] = plugin

    accelerate.Accelerator.__init__ = fsdp_on_cpu
    target = Path(out) / (TRAINER_FSDP2_FULL_TIED if full else TRAINER_FSDP2)
    ref = reference_dir(target)

    class SaveReference(TrainerCallback):
        def on_save(self, args, state, control, model=None, **kwargs):
            full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
            if rank == 0:
                ref.mkdir(parents=True, exist_ok=True)
                save_file(_clone_state(full), str(ref / f"checkpoint-{state.global_step}.safetensors"))

    args = TrainingArguments(
        output_dir=str(target), max_steps=MAX_STEPS, save_strategy="steps", save_steps=SAVE_STEPS,
        per_device_train_batch_size=2, learning_rate=1e-2, report_to="none", use_cpu=True, seed=0, data_seed=0,
        disable_tqdm=True, dataloader_num_workers=0, logging_steps=100, fsdp="full_shard auto_wrap",
        fsdp_config={"fsdp_version": 2, "state_dict_type": "FULL_STATE_DICT" if full else "SHARDED_STATE_DICT",
                     "reshard_after_forward": True, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                     "cpu_ram_efficient_loading": False})
    model = tiny_model(seed=0, tie_word_embeddings=True) if full else tiny_model(seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=_random_dataset(), callbacks=[SaveReference()])
    assert trainer.is_fsdp_enabled
    trainer.train()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


TRAINER_FSDP2, TRAINER_FSDP2_FULL_TIED = "hf_trainer_fsdp2", "hf_trainer_fsdp2_full_tied"


def write_hf_trainer_fsdp2(out: Path, *, full: bool = False) -> Path:
    """``out/hf_trainer_fsdp2/``: a transformers ``Trainer`` output dir of an FSDP2 run with
    ``fsdp_config.state_dict_type = SHARDED_STATE_DICT`` on 2 gloo ranks (4 steps, ``save_steps=2``). The
    Trainer saves through accelerate (``save_fsdp_model`` / ``save_fsdp_optimizer``), so each
    ``checkpoint-N/`` holds ``pytorch_model_fsdp_0/`` and ``optimizer_0/`` (DCP dirs), ``scheduler.pt``,
    ``rng_state_{0,1}.pth`` and ``trainer_state.json``: no config and no HF weights. The reference
    (``hf_trainer_fsdp2_ref/checkpoint-N.safetensors``) is each save's ``full_tensor()`` state dict from
    the Trainer's ``on_save`` callback.

    ``full``: ``out/hf_trainer_fsdp2_full_tied/``, the same run with ``FULL_STATE_DICT`` and
    ``tie_word_embeddings=True``: each checkpoint holds ``model.safetensors`` + ``config.json`` as
    ``save_model`` writes them from FSDP's gathered state dict, ``lm_head.weight`` and
    ``model.embed_tokens.weight`` as two equal tensors on separate storage."""
    from make_trainer_samples import _trainer_fsdp2_rank as rank_fn

    out.mkdir(parents=True, exist_ok=True)
    _spawn(functools.partial(rank_fn, full=full), out, world_size=ACCELERATE_WORLD)
    return out / (TRAINER_FSDP2_FULL_TIED if full else TRAINER_FSDP2)


def _fsdp1_local_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """``Accelerator.save_state`` of an FSDP1 run with ``state_dict_type="LOCAL_STATE_DICT"``: accelerate
    writes ``pytorch_model_fsdp_rank{r}.bin`` (each rank's flattened parameters as FSDP's local state
    dict: a ShardedTensor per FlatParameter) and ``optimizer_0/``. The one liberty, as on CPU it must:
    accelerate hands FSDP1 ``device_id`` ``cpu:0``, which FSDP1 rejects; it gets ``torch.device("cpu")``."""
    import functools as _functools
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    _init_gloo(rank, world_size, init_file)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1")
    import torch
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, set_seed
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    plain_init = FullyShardedDataParallel.__init__

    def init(self, *args, **kwargs):
        if str(kwargs.get("device_id")) in ("cpu", "cpu:0"):
            kwargs["device_id"] = torch.device("cpu")  # (FSDP1 takes a device, not accelerate's "cpu:0")
        plain_init(self, *args, **kwargs)

    FullyShardedDataParallel.__init__ = init
    torch.set_num_threads(1)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=1, state_dict_type="LOCAL_STATE_DICT", use_orig_params=True, sync_module_states=False,
        cpu_ram_efficient_loading=False,
        auto_wrap_policy=_functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}))
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    assert accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2
    set_seed(0)
    model = tiny_model(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    ids = torch.randint(0, TINY_TRAINER_LLAMA["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(rank))
    accelerator.backward(model(input_ids=ids, labels=ids).loss)
    optimizer.step()
    accelerator.save_state(str(Path(out) / "accelerate_fsdp1_local"))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def write_accelerate_fsdp1_local(out: Path) -> Path:
    """``Accelerator.save_state`` with FSDP1 LOCAL_STATE_DICT from 2 gloo ranks (``_fsdp1_local_rank``)."""
    from make_trainer_samples import _fsdp1_local_rank as rank_fn

    out.mkdir(parents=True, exist_ok=True)
    _spawn(rank_fn, out, world_size=ACCELERATE_WORLD)
    return out / "accelerate_fsdp1_local"


WRITERS = {
    "hf_trainer_run": write_hf_trainer_run,
    "hf_tied_bin": write_hf_tied_bin,
    "hf_tied_safetensors": write_hf_tied_safetensors,
    "accelerate_fsdp2": write_accelerate_fsdp2,
    "accelerate_fsdp1_local": write_accelerate_fsdp1_local,
}


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
