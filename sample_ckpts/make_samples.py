#!/usr/bin/env python
"""Write the tiny sample checkpoints ckptscope ships and tests against, with the real writers.

    python sample_ckpts/make_samples.py [OUT_DIR]      # default: sample_ckpts/

Every sample comes from the library that writes that format in the wild: transformers
``save_pretrained``, ``safetensors.torch.save_file``, ``torch.save`` (zip and legacy), and
huggingface_hub's shard splitter for ``pytorch_model-*.bin`` directories. Tests call the same
functions into a temporary directory, so the fixtures can never drift from the writers.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def tiny_llama(seed: int = 0, dtype: str = "bfloat16"):
    """A 4-layer GQA Llama with random weights (transformers model, CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    return model.to(getattr(torch, dtype))


def write_hf_sharded(out: Path) -> Path:
    """``save_pretrained`` with a small shard size: model-0000x-of-0000N.safetensors + index."""
    target = out / "hf_llama_sharded"
    tiny_llama().save_pretrained(target, max_shard_size="120KB")
    return target


def write_hf_single(out: Path) -> Path:
    """``save_pretrained`` default: one model.safetensors, no index."""
    target = out / "hf_llama_single"
    tiny_llama().save_pretrained(target)
    return target


def write_hf_bin_sharded(out: Path) -> Path:
    """The pre-safetensors HF layout: pytorch_model-0000x-of-0000N.bin + pytorch_model.bin.index.json.

    transformers 5 no longer writes .bin, so this uses what it used to: huggingface_hub's splitter
    and ``torch.save`` per shard.
    """
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    model = tiny_llama(seed=1, dtype="float16")
    target = out / "hf_llama_bin"
    target.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    split = split_torch_state_dict_into_shards(state, filename_pattern="pytorch_model{suffix}.bin",
                                               max_shard_size="150KB")
    for filename, names in split.filename_to_tensors.items():
        torch.save({n: state[n].contiguous() for n in names}, target / filename)
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (target / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2))
    model.config.save_pretrained(target)
    return target


def write_safetensors_dtypes(out: Path) -> Path:
    """One .safetensors file with every common dtype, a 0-d scalar, an empty tensor and metadata."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(2)
    tensors = {
        "float32.matrix": torch.randn(6, 5),
        "float16.vector": torch.randn(7).half(),
        "bfloat16.cube": torch.randn(2, 3, 4).bfloat16(),
        "float8.e4m3": (torch.randn(4, 4) * 4).to(torch.float8_e4m3fn),
        "float8.e5m2": (torch.randn(3, 2) * 4).to(torch.float8_e5m2),
        "int64.counts": torch.arange(9, dtype=torch.int64).reshape(3, 3),
        "int8.codes": torch.randint(-128, 127, (10,), dtype=torch.int8),
        "uint8.bytes": torch.randint(0, 255, (5,), dtype=torch.uint8),
        "bool.mask": torch.rand(8) > 0.5,
        "scalar.step": torch.tensor(1234.5),
        "empty.rows": torch.zeros(0, 4),
    }
    target = out / "dtypes.safetensors"
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, target, metadata={"format": "pt", "producer": "ckptscope samples"})
    _sort_metadata_keys(target)
    return target


def _sort_metadata_keys(path: Path) -> None:
    """safetensors keeps ``__metadata__`` in a Rust HashMap, so its keys come out in a random order
    per process; sorting them (same bytes, same length, nothing else moves) makes the file
    reproducible without changing what any reader sees."""
    import re
    import struct

    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length].decode()
    match = re.search(r'"__metadata__":(\{[^{}]*\})', header)
    if match:
        ordered = json.dumps(dict(sorted(json.loads(match.group(1)).items())), separators=(",", ":"))
        assert len(ordered) == len(match.group(1))
        header = header[:match.start(1)] + ordered + header[match.end(1):]
        data[8:8 + length] = header.encode()
        path.write_bytes(bytes(data))


def write_megatron_style_pt(out: Path) -> Path:
    """A training checkpoint the way Megatron/most trainers pickle one: model state dict nested
    under ``model``, argparse ``args``, iteration, rng state, optimizer state with param groups."""
    import torch

    model = tiny_llama(seed=3, dtype="float32")
    state = model.state_dict()
    first = next(iter(state))
    args = argparse.Namespace(num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                              tensor_model_parallel_size=1, pipeline_model_parallel_size=1, lr=3e-4,
                              bf16=True, seq_length=128, iteration=20)
    checkpoint = {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": 20,
        "model": state,
        "optimizer": {
            "state": {0: {"step": torch.tensor(20.0), "exp_avg": torch.zeros_like(state[first]),
                          "exp_avg_sq": torch.zeros_like(state[first])}},
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "params": [0]}],
        },
        "rng_state": [{"random_rng_state": (3, tuple(range(5)), None), "torch_rng_state": torch.get_rng_state()}],
        # A transposed view: stored with its original storage and strides.
        "extra.transposed_view": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
    }
    target = out / "megatron_style.pt"
    out.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, target)
    return target


def write_legacy_pt(out: Path) -> Path:
    """The pre-1.6 (non-zip) torch.save stream."""
    import torch

    torch.manual_seed(4)
    state = {"encoder.weight": torch.randn(8, 4), "encoder.bias": torch.randn(8),
             "decoder.weight": torch.randn(4, 8).double(), "steps": torch.tensor([3, 1, 4], dtype=torch.int32)}
    target = out / "legacy_format.pt"
    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, target, _use_new_zipfile_serialization=False)
    _number_legacy_storage_keys(target)
    return target


def _number_legacy_storage_keys(path: Path) -> None:
    """Make a legacy torch.save file byte-reproducible. The legacy writer keys each storage by its
    memory address (``str(storage._cdata)``) and writes the storages in the sorted order of those
    keys, so both the keys and the order of the data blocks change from process to process. Here
    each key becomes a zero-padded counter of the same length in order of first use in the object
    tree, and the key list and data blocks (8-byte element count + raw bytes each) follow that order;
    torch reads the result exactly as before (tests/test_samples_reproducible.py)."""
    import pickle
    import struct

    data = path.read_bytes()
    stream = io.BytesIO(data)
    for _ in range(3):  # magic number, protocol version, system info
        pickle.load(stream)
    used: list[str] = []

    class _Skim(pickle.Unpickler):
        def find_class(self, module, name):
            return lambda *args, **kwargs: None

        def persistent_load(self, pid):
            if pid[2] not in used:
                used.append(pid[2])

    _Skim(stream).load()
    keys_start = stream.tell()
    keys = pickle.load(stream)
    pickles_end = stream.tell()
    blocks: dict[str, bytes] = {}
    offset = pickles_end
    element_sizes = _legacy_element_sizes(data[:pickles_end])
    for key in keys:  # data blocks follow the key list: 8-byte element count, then the bytes
        (count,) = struct.unpack("<q", data[offset:offset + 8])
        length = 8 + count * element_sizes[key]
        blocks[key] = data[offset:offset + length]
        offset += length
    renamed = {key: str(number).zfill(len(key)) for number, key in enumerate(used)}
    head = data[:keys_start]
    for key, new in renamed.items():
        head = head.replace(b"X" + len(key).to_bytes(4, "little") + key.encode(),
                            b"X" + len(new).to_bytes(4, "little") + new.encode())
    new_keys = pickle.dumps([renamed[k] for k in used], protocol=2)
    path.write_bytes(head + new_keys + b"".join(blocks[k] for k in used) + data[offset:])


def _legacy_element_sizes(pickles: bytes) -> dict[str, int]:
    """Storage key -> element size, from the storage classes named in the persistent ids."""
    import pickle

    sizes = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
             "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1}
    out: dict[str, int] = {}
    stream = io.BytesIO(pickles)
    for _ in range(3):
        pickle.load(stream)

    class _Types(pickle.Unpickler):
        def find_class(self, module, name):
            return name if module == "torch" and name.endswith("Storage") else (lambda *a, **k: None)

        def persistent_load(self, pid):
            out[pid[2]] = sizes[pid[1]]

    _Types(stream).load()
    return out


WRITERS = {
    "hf_llama_sharded": write_hf_sharded,
    "hf_llama_single": write_hf_single,
    "hf_llama_bin": write_hf_bin_sharded,
    "dtypes.safetensors": write_safetensors_dtypes,
    "megatron_style.pt": write_megatron_style_pt,
    "legacy_format.pt": write_legacy_pt,
}


def run_writers(writers: dict, argv: list[str] | None, description: str) -> int:
    """The command line shared by the sample scripts: ``[OUT_DIR] [--only NAME ...]``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", nargs="?", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--only", nargs="*", choices=sorted(writers), help="write only these samples")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for name in args.only or writers:
        path = writers[name](out)
        print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
