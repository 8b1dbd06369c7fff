"""Logits oracle for HF <-> Megatron-Core tests: run the real models, compare what they predict.

* ``hf_logits(hf_dir, tokens)``: transformers forward of an HF dir.
* ``mcore_logits_from_dist(iter_dir, hf_config_or_args, tokens)``: a fresh megatron-core GPTModel
  (local spec, TP=1) loads a torch_dist dir with ``dist_checkpointing.load(model.sharded_state_dict())``
  and runs forward. A torch_dist dir written by any converter (ckptscope's included) that gives the
  same logits as its HF source is loadable by real Megatron and numerically right.

Megatron work runs in this process, in a gloo world of 1 that is created once and reused, with the
torch.cuda stubs on only while Megatron code runs (sample_ckpts/make_mcore_pair_samples.py
``cpu_megatron``). Only tests import this module; ckptscope itself never imports torch here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_ckpts"


def generators():
    """sample_ckpts/make_mcore_pair_samples.py as a module (on sys.path so spawned ranks can import it)."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_mcore_pair_samples")


def iteration_dir(path: Path) -> Path:
    """Accept a Megatron save root (tracker file) or an ``iter_XXXXXXX`` dir."""
    path = Path(path)
    tracker = path / "latest_checkpointed_iteration.txt"
    if tracker.exists():
        return path / f"iter_{int(tracker.read_text().strip()):07d}"
    return path


def tokens_for(vocab_size: int, batch: int = 2, seq: int = 12, seed: int = 7):
    """The generator's fixed token batch (ids < vocab_size)."""
    return generators().tokens_for(vocab_size, batch, seq, seed)


def hf_logits(hf_dir: Path, tokens):
    """transformers logits [b, s, V] (fp32, eager attention) of an HF model dir."""
    gen = generators()
    return gen.hf_model_logits(gen.load_hf_model(Path(hf_dir)), tokens)


def common_state(iter_dir: Path) -> dict:
    """common.pt of a torch_dist dir (args Namespace, iteration, checkpoint_version)."""
    import torch

    return torch.load(iteration_dir(iter_dir) / "common.pt", map_location="cpu", weights_only=False)


def stored_vocab_rows(iter_dir: Path) -> int:
    """Rows of ``embedding.word_embeddings.weight`` as stored (the padded vocab the writer chose)."""
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(iteration_dir(iter_dir))).read_metadata()
    return int(md.state_dict_metadata["embedding.word_embeddings.weight"].size[0])


def reference_args(iter_dir: Path, hf_config_or_args=None) -> argparse.Namespace:
    """Megatron args for a TP=1 GPTModel that can load ``iter_dir``.

    ``hf_config_or_args``: a Megatron ``argparse.Namespace``, a transformers config, an HF model dir,
    or None (use the ``args`` in the checkpoint's common.pt). TP is forced to 1 (torch_dist reshards on
    load) and ``padded_vocab_size`` is taken from the checkpoint itself, so converters that pad
    differently still load.
    """
    gen = generators()
    source = hf_config_or_args
    if source is None:
        args = common_state(iter_dir)["args"]
    elif isinstance(source, argparse.Namespace):
        args = source
    else:
        if isinstance(source, (str, Path)):
            from transformers import AutoConfig

            source = AutoConfig.from_pretrained(str(source))
        args = gen.megatron_args(source, tp=1)
    return argparse.Namespace(**{**vars(args), "tensor_model_parallel_size": 1,
                                 "padded_vocab_size": stored_vocab_rows(iter_dir)})


def mcore_logits_from_dist(iter_dir: Path, hf_config_or_args=None, tokens=None, strict: str = "assume_ok_unexpected"):
    """Logits [b, s, V_pad] of a fresh GPTModel that loaded ``iter_dir`` via megatron-core dist_checkpointing.

    Parameters are filled with NaN before the load, so anything the checkpoint did not provide shows up
    as NaN logits. ``strict`` is passed to ``dist_checkpointing.load`` (Megatron-LM's default is
    ``assume_ok_unexpected``: a key the model asks for but the checkpoint lacks is an error).
    """
    import torch
    from megatron.core import dist_checkpointing

    gen = generators()
    iter_dir = iteration_dir(iter_dir)
    args = reference_args(iter_dir, hf_config_or_args)
    if tokens is None:
        tokens = tokens_for(getattr(args, "vocab_size", None) or args.padded_vocab_size)
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        model = gen.build_gpt_model(args)
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))
        # As megatron.training.checkpointing does: the model under "model", common state merged in.
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(iter_dir), strict=strict)
        if isinstance(loaded, tuple):  # the RETURN_* strict modes also return mismatched keys
            loaded = loaded[0]
        model.load_state_dict(loaded["model"], strict=True)
        return gen.mcore_model_logits(model, tokens)


def allow_router_without_te() -> None:
    """megatron-core 0.16.1's ``router_gating_linear`` names ``te_general_gemm``, which moe_utils defines only
    when TransformerEngine imports; None selects its plain torch path (a MoE forward on CPU needs it)."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
