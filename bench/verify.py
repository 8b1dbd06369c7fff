"""Independent checks of what the write rows wrote, made on the untimed warm-up run: each output is
read back by the library its users load it with (safetensors, torch DCP), never by ckptscope, so a
row cannot pass on a fast writer that writes the wrong bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

from abab import BenchError


def _st_tensors(root: Path) -> dict:
    """name -> (file, name) of every tensor in the ``*.safetensors`` files of an HF dir."""
    from safetensors import safe_open

    where = {}
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                where[name] = file
    return where


def _bytes_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _load(file: Path, name: str):
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return handle.get_tensor(name)


def same_hf_tensors(src: str, out: str, sub: tuple[str, str] | None = None) -> None:
    """``out`` holds every tensor of the HF dir ``src``, bit for bit, and nothing else; with ``sub``
    (pattern, replacement) under the names ``re.sub`` gives, as ``rename --sub`` promises."""
    src, out = Path(src), Path(out)
    want, got = _st_tensors(src), _st_tensors(out)
    expected = {(re.sub(sub[0], sub[1], name) if sub else name): name for name in want}
    if set(got) != set(expected):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise BenchError(f"{out}: tensors differ from {src}: missing {missing[:3]}, unexpected {extra[:3]}")
    for new, old in expected.items():
        if not _bytes_equal(_load(want[old], old), _load(got[new], new)):
            raise BenchError(f"{out}: {new} is not bit-identical to {src}'s {old} (read with safetensors)")


def torch_dist_of_hf(src: str, out: str) -> None:
    """A Megatron torch_dist save of the HF dir ``src``, as torch DCP reads it: its tensors hold as
    many bytes as the HF tensors (fusing QKV and gate/up moves bytes, adds none), and the final
    norm and the word embeddings it loads are the HF ones bit for bit."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    src, out = Path(src), Path(out)
    iters = sorted(p for p in out.iterdir() if re.fullmatch(r"iter_\d{7}", p.name))
    if len(iters) != 1:
        raise BenchError(f"{out}: expected one iter_NNNNNNN dir, found {[p.name for p in iters]}")
    meta = dcp.FileSystemReader(str(iters[0])).read_metadata().state_dict_metadata
    tensors = {k: v for k, v in meta.items() if isinstance(v, TensorStorageMetadata)}
    stored = sum(v.size.numel() * v.properties.dtype.itemsize for v in tensors.values())
    hf = _st_tensors(src)
    expected = sum(_load(f, n).nbytes for n, f in hf.items())
    if stored != expected:
        raise BenchError(f"{out}: torch DCP metadata holds {stored} tensor bytes, the HF source {expected}")
    pairs = {"decoder.final_layernorm.weight": "model.norm.weight",
             "embedding.word_embeddings.weight": "model.embed_tokens.weight"}
    state = {k: torch.empty(tensors[k].size, dtype=tensors[k].properties.dtype) for k in pairs}
    dcp.load(state, checkpoint_id=str(iters[0]))
    for k, hf_name in pairs.items():
        if not _bytes_equal(state[k], _load(hf[hf_name], hf_name)):
            raise BenchError(f"{out}: {k} as torch DCP loads it is not the HF {hf_name}")


def merged_fsdp2(out: str, gb: float, world: int) -> None:
    """The HF dir merged from ``data.fsdp2_verl``'s shards holds the full tensors its seeds give."""
    from data import fsdp2_full_tensors

    got = _st_tensors(Path(out))
    for name, full in fsdp2_full_tensors(gb, world):
        if name not in got or not _bytes_equal(_load(got[name], name), full):
            raise BenchError(f"{out}: {name} is missing or differs from the tensor the FSDP2 ranks held")
