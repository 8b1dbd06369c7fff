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


def assert_diff_clean(hf_dir: Path, *mcore_dirs: Path) -> None:
    """``ckptscope diff`` across naming finds every HF tensor identical in each Megatron output."""
    from tests.conftest import run_cli

    for mcore in mcore_dirs:
        result = run_cli("diff", str(hf_dir), str(mcore), "--plain")
        assert result.code == 0, result.out + result.err
        assert ": identical" in result.out and " 0 different" in result.out, result.out


def load_strictly(model, iter_dir: Path) -> None:
    """Fill ``model`` from a torch_dist dir after checking that the real model's ``sharded_state_dict()``
    asks for exactly the stored keys (tensors with their shapes; a layer's stacked experts by their trailing
    axes; the linears' extra-state objects by storage key), with megatron-core's strictest load. Run it
    where the model was built (its CPU shims on)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensorFactory
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from torch.distributed.checkpoint import FileSystemReader

    stored = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    sharded = model.sharded_state_dict()
    wanted = {}
    for item in sharded.values():
        if isinstance(item, ShardedObject):  # the linears' extra states: one storage key per shard
            wanted[item.unique_key] = None
        elif isinstance(item, ShardedTensorFactory):  # gated fc1 (W and V halves): its whole tensor
            wanted[item.key] = tuple(item.data.shape)
        else:
            wanted[item.key] = tuple(item.global_shape)
    assert set(wanted) == set(stored)
    for key, shape in wanted.items():
        if shape is not None:
            assert tuple(stored[key].size)[-len(shape):] == shape, key
            assert tuple(stored[key].size) == shape or ".experts.experts." in key, key
    loaded = dist_checkpointing.load({"model": sharded}, str(iter_dir), strict=StrictHandling.RAISE_ALL)
    model.load_state_dict(loaded["model"], strict=True)


def perturbed_logits(model, name: str, value: Callable, logits: Callable):
    """``logits(model)`` with one loaded parameter or buffer replaced by ``value(current)``, then restored."""
    import torch

    target = dict(model.named_parameters()) | dict(model.named_buffers())
    saved = target[name].detach().clone()
    with torch.no_grad():
        target[name].copy_(value(saved))
    try:
        return logits(model)
    finally:
        with torch.no_grad():
            target[name].copy_(saved)


def append_mtp_layer(hf_dir: Path, num_layers: int, hidden: int) -> str:
    """Add MTP layer 0 to ``hf_dir/model.safetensors`` as the DeepSeek-V3 and GLM-4.5 releases store it
    (transformers builds no MTP layers, so ``save_pretrained`` writes none): ``model.layers.{num_layers}.``
    holds a decoder layer like the last one (perturbed), ``enorm``, ``hnorm``, ``eh_proj``,
    ``shared_head.norm`` and copies of the embedding and head. Returns that prefix."""
    import torch
    from safetensors.torch import save_file

    tensors = hf_tensors(hf_dir)
    mtp, last = f"model.layers.{num_layers}.", f"model.layers.{num_layers - 1}."
    gen = torch.Generator().manual_seed(1)
    for name, value in list(tensors.items()):
        if name.startswith(last):
            tensors[mtp + name[len(last):]] = value + 0.05 * torch.randn(value.shape, generator=gen)
    tensors.update({
        mtp + "enorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        mtp + "hnorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        mtp + "eh_proj.weight": 0.05 * torch.randn(hidden, 2 * hidden, generator=gen),
        mtp + "shared_head.norm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        mtp + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
        mtp + "shared_head.head.weight": tensors["lm_head.weight"].clone(),
    })
    save_file(tensors, Path(hf_dir) / "model.safetensors", metadata={"format": "pt"})
    return mtp


def assert_hf_config_refused(hf_dir: Path, tmp_path: Path, change: dict, message: str) -> None:
    """An export to Megatron of ``hf_dir`` with ``change`` made to its config.json exits 2 naming
    ``message``, and writes nothing."""
    import json

    from tests.conftest import run_cli

    edited = tmp_path / "hf"
    shutil.copytree(hf_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    config.update(change)
    (edited / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "mcore")
    assert result.code == 2 and message in result.err, result.err
    assert not (tmp_path / "out").exists()
