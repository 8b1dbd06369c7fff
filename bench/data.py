"""Checkpoint generators for the benchmarks. Each runs in a child process (``abab.generate``) so
the parent stays small (a child's peak RSS starts at its parent's, Linux keeps ``ru_maxrss``
across fork + exec) and torch's memory is given back when the child exits.

Every function takes JSON-able keyword arguments and returns a JSON-able dict. The files are
written by the real writers (``safetensors``, ``torch.save`` of DTensors on a gloo group).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path


def _names(tensors: int) -> list[tuple[str, tuple[int, ...]]]:
    """MoE-shaped names and tiny shapes: layers of 2 norms, 4 attention projections, a router and
    128 experts x 3, cut at ``tensors``. Expert shapes vary so no layer or expert range collapses
    (the worst case for the tree), as in the old TUI start-up bench."""
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (16, 8))]
    layer = 0
    while len(out) < tensors:
        p = f"model.layers.{layer}"
        out += [(f"{p}.input_layernorm.weight", (8,)), (f"{p}.post_attention_layernorm.weight", (8,))]
        out += [(f"{p}.self_attn.{proj}.weight", (4, 4)) for proj in ("q_proj", "k_proj", "v_proj", "o_proj")]
        out.append((f"{p}.mlp.gate.weight", (128, 8)))
        out += [(f"{p}.mlp.experts.{e}.{w}.weight", (2 + (e + layer) % 3, 4))
                for e in range(128) for w in ("gate_proj", "up_proj", "down_proj")]
        layer += 1
    return out[:tensors]


def many_tensors(path: str, tensors: int, shards: int = 1) -> dict:
    """An HF dir with ``tensors`` tiny fp16 tensors in ``shards`` files (+ index when sharded):
    the metadata-bound case, where reading headers is all the work there is."""
    import numpy as np
    from safetensors.numpy import save_file

    root = Path(path)
    root.mkdir(parents=True)
    names = _names(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: np.zeros(shape, dtype=np.float16) for n, shape in names[s * per:(s + 1) * per]}
        save_file(part, str(root / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    if shards > 1:
        total = sum(2 * int(np.prod(shape)) for _, shape in names)
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return {"tensors": len(names), "files": shards}


def _llama_shapes(gb: float, itemsize: int = 2, vocab: int = 32000) -> tuple[dict, list]:
    """A Llama config (GQA) and its HF tensor shapes, with as many layers as fit in ``gb`` GB at
    ``itemsize`` bytes per value (hidden 2048 from 1 GB up, else 1024)."""
    hidden, ffn = (2048, 5632) if gb >= 1 else (1024, 2816)
    heads, kv = 16, 4
    hd = hidden // heads
    per_layer = itemsize * (2 * hidden * hidden + 2 * kv * hd * hidden + 3 * ffn * hidden)
    layers = max(2, round((gb * 1e9 - 2 * itemsize * vocab * hidden) / per_layer))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "hidden_act": "silu"}
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,)),
                   (p + "self_attn.q_proj.weight", (heads * hd, hidden)),
                   (p + "self_attn.k_proj.weight", (kv * hd, hidden)),
                   (p + "self_attn.v_proj.weight", (kv * hd, hidden)),
                   (p + "self_attn.o_proj.weight", (hidden, heads * hd)),
                   (p + "mlp.gate_proj.weight", (ffn, hidden)), (p + "mlp.up_proj.weight", (ffn, hidden)),
                   (p + "mlp.down_proj.weight", (hidden, ffn))]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return config, shapes


def llama_hf(path: str, gb: float, shards: int = 4) -> dict:
    """A Llama-shaped HF model of about ``gb`` GB: bf16 matrices, f32 norms (as mixed-precision
    trainers save them), ``shards`` safetensors files + index + config.json."""
    import torch
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True)
    config, shapes = _llama_shapes(gb)
    gen = torch.Generator().manual_seed(0)
    sizes = [(n, s, torch.float32 if len(s) == 1 else torch.bfloat16) for n, s in shapes]
    total = sum(torch.Size(s).numel() * dt.itemsize for _, s, dt in sizes)
    weight_map, part, part_bytes, index = {}, {}, 0, 1
    for i, (name, shape, dtype) in enumerate(sizes):
        part[name] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
        part_bytes += part[name].nbytes
        if part_bytes >= total / shards or i == len(sizes) - 1:
            fname = f"model-{index:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(root / fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, fname))
            part, part_bytes, index = {}, 0, index + 1
    if index - 1 != shards:  # fewer files than planned: rename so the "-of-N" suffix is right
        real = index - 1
        renames = {f"model-{k:05d}-of-{shards:05d}.safetensors": f"model-{k:05d}-of-{real:05d}.safetensors"
                   for k in range(1, real + 1)}
        for old, new in renames.items():
            (root / old).rename(root / new)
        weight_map = {n: renames[f] for n, f in weight_map.items()}
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(config))
    largest = max(torch.Size(s).numel() * dt.itemsize for _, s, dt in sizes)
    return {"bytes": total, "largest": largest, "tensors": len(sizes), "layers": config["num_hidden_layers"]}


def patched_copy(path: str, src: str, count: int = 3) -> dict:
    """``path`` = a copy of the HF dir ``src`` in which ``count`` tensors differ in one element (the
    low mantissa bit of their first value flipped in place), so the rest is byte-identical."""
    shutil.copytree(src, path)
    files = sorted(Path(path).glob("*.safetensors"))
    changed = []
    for k in range(count):
        with open(files[k % len(files)], "r+b") as handle:
            size = struct.unpack("<Q", handle.read(8))[0]
            header = json.loads(handle.read(size))
            names = sorted(n for n in header if n != "__metadata__" and header[n]["dtype"] == "BF16")
            name = names[(k * 7919) % len(names)]
            handle.seek(8 + size + header[name]["data_offsets"][0])
            first = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([first[0] ^ 1]))
            changed.append(name)
    return {"changed": changed}


# --- FSDP2 shards (verl's FSDP checkpoint manager layout) -------------------------------------------


def _fsdp2_rank(rank: int, world: int, out: str, gb: float, init_file: str) -> None:
    """One rank: the Llama tensors (f32, as FSDP2 keeps master weights) row-sharded ``Shard(0)``
    on a 1-D ``("fsdp",)`` mesh, saved as verl does: ``torch.save(model.state_dict())`` per rank."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    _, shapes = _llama_shapes(gb, itemsize=4)
    gen = torch.Generator().manual_seed(1 + rank)
    state = {}
    for name, shape in shapes:
        rows = -(-shape[0] // world)  # torch.chunk semantics, as FSDP2 shards dim 0
        local = torch.randn((max(0, min(rows, shape[0] - rank * rows)), *shape[1:]), generator=gen) * 0.02
        state[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                         stride=torch.empty(shape, device="meta").stride())
    torch.save(state, Path(out) / f"model_world_size_{world}_rank_{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def fsdp2_full_tensors(gb: float, world: int = 2):
    """(name, full tensor) of what ``fsdp2_verl`` wrote, re-derived from its seeds (each rank's
    generator draws its row block of every tensor in turn): the bench checks a merge against
    this, not against ckptscope's own reading of the shards."""
    import torch

    _, shapes = _llama_shapes(gb, itemsize=4)
    gens = [torch.Generator().manual_seed(1 + rank) for rank in range(world)]
    for name, shape in shapes:
        rows = -(-shape[0] // world)
        parts = [torch.randn((max(0, min(rows, shape[0] - rank * rows)), *shape[1:]), generator=gens[rank]) * 0.02
                 for rank in range(world)]
        yield name, torch.cat(parts)


def fsdp2_verl(path: str, gb: float, world: int = 2) -> dict:
    """A verl FSDP2 actor dir (``model_world_size_W_rank_R.pt``, ``fsdp_config.json``,
    ``huggingface/config.json``) of about ``gb`` GB, written by ``world`` gloo ranks. This is
    cheaper than training with ``fully_shard`` and gives the same files: DTensor state dicts."""
    import torch
    import torch.multiprocessing as mp

    root = Path(path)
    (root / "huggingface").mkdir(parents=True)
    config, shapes = _llama_shapes(gb, itemsize=4)
    config["torch_dtype"] = "float32"
    (root / "huggingface" / "config.json").write_text(json.dumps(config))
    (root / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world}))
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_fsdp2_rank, args=(world, str(root), gb, os.path.join(tmp, "rendezvous")), nprocs=world)
    sizes = [torch.Size(s).numel() * 4 for _, s in shapes]
    return {"bytes": sum(sizes), "largest": max(sizes), "tensors": len(shapes)}


def timeline_root(path: str, src: str, iterations: int = 10) -> dict:
    """An HF Trainer ``output_dir`` with ``checkpoint-1`` .. ``checkpoint-<iterations>``, each the HF dir
    ``src`` with one tensor changed (one bit of its first value, as ``patched_copy``), so consecutive
    iterations differ and none equals another. To spare the disk, every file but the patched shard is
    a hard link to ``src``'s: the timeline still reads every iteration's every byte (it has no way to
    know two files are one inode), and so does ``cat``."""
    root = Path(path)
    root.mkdir(parents=True)
    files = sorted(Path(src).iterdir())
    shards = sorted((f for f in files if f.suffix == ".safetensors"), key=lambda f: f.stat().st_size)
    patched = shards[0]
    for k in range(1, iterations + 1):
        step = root / f"checkpoint-{k}"
        step.mkdir()
        for f in files:
            if f == patched:
                shutil.copyfile(f, step / f.name)
            else:
                os.link(f, step / f.name)
        with open(step / patched.name, "r+b") as handle:
            size = struct.unpack("<Q", handle.read(8))[0]
            header = json.loads(handle.read(size))
            name = sorted(n for n in header if n != "__metadata__")[0]
            handle.seek(8 + size + header[name]["data_offsets"][0])  # low mantissa byte of the first value
            first = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([first[0] ^ k]))  # k <= 255: a different finite value per iteration
        (step / "trainer_state.json").write_text(json.dumps({"global_step": k}))
    return {"iterations": iterations, "patched_file": patched.name}


def timeline_dense_root(path: str, src: str, iterations: int = 10) -> dict:
    """Like ``timeline_root``, but every weight changes at every iteration, as in real training:
    iteration k is ``src`` with the low mantissa bits of every 16-bit value XORed with k (and every
    32-bit value's lowest byte), so no block of one iteration equals the previous one's and the
    timeline cannot skip a byte-equal block. Every file is a real copy."""
    import numpy as np

    root = Path(path)
    root.mkdir(parents=True)
    files = sorted(Path(src).iterdir())
    for k in range(1, iterations + 1):
        step = root / f"checkpoint-{k}"
        step.mkdir()
        for f in files:
            if f.suffix != ".safetensors":
                shutil.copyfile(f, step / f.name)
                continue
            raw = bytearray(f.read_bytes())
            size = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8:8 + size])
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                lo, hi = (8 + size + o for o in info["data_offsets"])
                if info["dtype"] in ("BF16", "F16"):
                    np.frombuffer(memoryview(raw)[lo:hi], dtype=np.uint16)[:] ^= np.uint16(k & 7)
                elif info["dtype"] == "F32":
                    np.frombuffer(memoryview(raw)[lo:hi], dtype=np.uint32)[:] ^= np.uint32(k & 0xFF)
            (step / f.name).write_bytes(raw)
        (step / "trainer_state.json").write_text(json.dumps({"global_step": k}))
    return {"iterations": iterations}
