"""Shared steps of the per-architecture HF <-> Megatron-Core proofs (test_gpt_oss.py, test_llama4.py):
convert with ckptscope, run transformers, load a Megatron checkpoint into a real megatron-core model.

Only tests import this module; torch, transformers and megatron-core are imported inside the helpers.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tests.mcore_reference import allow_router_without_te, generators


def convert(src: Path, dst: Path, **kw) -> Path:
    """ckptscope's conversion, through the same plan/execute the CLI uses."""
    from ckptscope.ops.convert.execute import execute_convert
    from ckptscope.ops.convert.plan import plan_convert

    execute_convert(plan_convert(src, dst, **kw))
    return dst


def hf_tensors(hf_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(Path(hf_dir) / "model.safetensors")


def eager_logits(hf_dir: Path, tokens):
    """transformers logits (fp32, eager attention); every weight must load (no missing/unexpected keys)."""
    import torch
    import transformers

    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                                     attn_implementation="eager",
                                                                     output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        return model.eval()(input_ids=tokens).logits


def megatron_args(dist_dir: Path) -> dict:
    import torch

    return vars(torch.load(Path(dist_dir) / "iter_0000000" / "common.pt", map_location="cpu", weights_only=False)["args"])


def rewrite_args(dist_dir: Path, tmp_path: Path, **changes) -> Path:
    """A copy of ``dist_dir`` whose common.pt args differ (``None`` deletes a key)."""
    import torch

    copy = tmp_path / "edited"
    shutil.copytree(dist_dir, copy)
    path = copy / "iter_0000000" / "common.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    for key, value in changes.items():
        if value is None:
            delattr(state["args"], key)
        else:
            setattr(state["args"], key, value)
    torch.save(state, path)
    return copy


def mcore_load(dist_dir: Path, build: Callable[[dict], object], tokens, vocab: int):
    """(state, sharded state dict, logits[..., :vocab]) of ``build(args)``, a fresh megatron-core model
    (parameters NaN first) filled by ``dist_checkpointing.load`` from ``dist_dir`` (gloo world of 1)."""
    import torch
    from megatron.core import dist_checkpointing

    allow_router_without_te()
    gen = generators()
    iter_dir = Path(dist_dir) / "iter_0000000"
    args = megatron_args(dist_dir)
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        model = build(args)
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))
        wanted = model.sharded_state_dict()
        loaded = dist_checkpointing.load({"model": wanted}, str(iter_dir), strict="assume_ok_unexpected")
        model.load_state_dict(loaded["model"], strict=True)
        logits = gen.mcore_model_logits(model, tokens)[..., :vocab]
        return model.state_dict(), wanted, logits


def assert_round_trip(hf_dir: Path, tmp_path: Path, tokens, carried: tuple[str, ...], hf_class: str, **kw) -> None:
    """HF -> Megatron (``kw``: format and parallel sizes) -> HF without --hf-config gives bitwise-equal
    transformers logits, the ``carried`` config keys and the model class."""
    import json

    import torch

    mcore = convert(hf_dir, tmp_path / "mcore", to="mcore", **kw)
    back = convert(mcore, tmp_path / "hf", to="hf")  # everything from the Megatron args
    assert torch.equal(eager_logits(back, tokens), eager_logits(hf_dir, tokens))
    src, got = (json.loads((Path(d) / "config.json").read_text()) for d in (hf_dir, back))
    for key in carried:
        assert got.get(key) == src.get(key), key
    assert got["architectures"] == [hf_class]
