#!/usr/bin/env python
"""Write tiny HF <-> Megatron-Core checkpoint pairs whose conversion is proven by equal logits.

    python sample_ckpts/make_mcore_pair_samples.py [OUT_DIR] [--only NAME ...]   # default: sample_ckpts/

Without ``--only`` it writes what ships in sample_ckpts/ (``SHIPPED``: hf_llama_gqa, mcore_llama_gqa,
< 1 MB together); ``--only`` picks any of ``WRITERS``, and a bare ``--only`` writes them all.

For each tiny architecture in ``ARCHS`` (Llama GQA untied, Qwen2 tied with QKV bias, Qwen3 with
head_dim != hidden/heads and q/k norm):

* ``hf_<name>/``: transformers ``save_pretrained`` (safetensors, fp32), random non-trivial weights
  (norms and biases randomised too) and a vocabulary that is not a multiple of 128.
* ``mcore_<name>/``: a Megatron save root (``latest_checkpointed_iteration.txt`` + ``iter_0000000/``)
  written by megatron-core ``dist_checkpointing.save(model.sharded_state_dict())`` of a GPTModel
  (local spec) holding the same weights, with the ``args``/``iteration``/``checkpoint_version``
  common state Megatron training writes. ``mcore_llama_gqa_tp2/`` is the same on 2 gloo ranks (TP=2).

The HF -> GPTModel move is written here, from the MAPPING.md formulas only (grouped QKV interleave
§2.1/§2.3, ``[gate; up]`` §3, vocab padded with zero rows §4.1, tied embeddings §1.5). It is the
independent oracle for ckptscope's own converter, so it deliberately does not import
``ckptscope.mappings``. Before anything is saved, the GPTModel's logits on a fixed token batch must
equal transformers' logits (max abs diff <= ``LOGITS_ATOL`` over the true vocab): that is what makes
the pair a reference rather than a second guess.

megatron-core touches ``torch.cuda`` on CPU (FORMATS.md §11). Single-rank work runs in this process
inside ``cpu_megatron()``, which stubs those functions only while Megatron code runs and puts them
back afterwards (tests share the interpreter); spawned TP=2 ranks use make_dist_samples' stubs.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from make_dist_samples import _init_gloo, _spawn, _stub_cuda

ITERATION = 0
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
LOGITS_ATOL = 1e-5
SEED = 1234

_COMMON = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
           "num_key_value_heads": 2, "vocab_size": 250, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}

# name -> (transformers class, config kwargs). Every one is GQA (8 query heads, 2 KV groups).
ARCHS: dict[str, tuple[str, dict]] = {
    "llama_gqa": ("LlamaForCausalLM", dict(_COMMON, rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen2_tied": ("Qwen2ForCausalLM", dict(_COMMON, rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", dict(_COMMON, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=False)),
}


# --- the HF side ---------------------------------------------------------------------------------


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def hf_config(name: str):
    """The transformers config of one tiny architecture."""
    import transformers

    cls_name, kwargs = ARCHS[name]
    config_cls = getattr(transformers, cls_name).config_class
    return config_cls(**kwargs, torch_dtype="float32")


def random_hf_model(name: str, seed: int = SEED):
    """A transformers model with random weights everywhere (norms and biases too), fp32, eval mode.

    Scales keep activations O(1) so attention is far from uniform and any misplaced row changes the
    logits by much more than ``LOGITS_ATOL``.
    """
    import torch
    import transformers

    cls_name, _ = ARCHS[name]
    model = getattr(transformers, cls_name)(hf_config(name)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                value = 1.0 + 0.2 * torch.randn(param.shape, generator=gen)
            elif pname.endswith(".bias"):
                value = 0.2 * torch.randn(param.shape, generator=gen)
            else:  # [out, in] matrices and the [V, H] embedding: std 1/sqrt(H) keeps logits O(1)
                value = torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5
            param.copy_(value)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def write_hf(name: str, out: Path) -> Path:
    """``hf_<name>/`` by ``save_pretrained`` (one model.safetensors, fp32)."""
    target = Path(out) / f"hf_{name}"
    _quiet_transformers()
    random_hf_model(name).save_pretrained(target)
    return target


def load_hf_model(hf_dir: Path):
    """Load an HF dir back with transformers (eager attention, fp32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                attn_implementation="eager").eval()


def tokens_for(vocab_size: int, batch: int = 2, seq: int = 12, seed: int = 7):
    """A fixed [batch, seq] token batch drawn from the true vocab (covers ids near the top)."""
    import torch

    tokens = torch.randint(0, vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))
    tokens[0, -1] = vocab_size - 1
    return tokens


def hf_model_logits(model, tokens):
    """transformers logits [b, s, V] in fp32."""
    import torch

    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


# --- Megatron arguments and model ------------------------------------------------------------------


def padded_vocab_size(vocab: int, tp: int, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron's V_pad = ceil(V / (m*T)) * (m*T) (MAPPING.md §4.1)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def megatron_args(config, tp: int = 1) -> argparse.Namespace:
    """The Megatron-LM ``args`` a real run of this HF architecture would have (names as in arguments.py)."""
    import torch

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    groups = config.num_key_value_heads
    model_type = config.model_type
    return argparse.Namespace(
        num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        ffn_hidden_size=config.intermediate_size, num_attention_heads=heads,
        group_query_attention=groups != heads, num_query_groups=groups, kv_channels=head_dim,
        vocab_size=config.vocab_size, padded_vocab_size=padded_vocab_size(config.vocab_size, tp),
        make_vocab_size_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
        untie_embeddings_and_output_weights=not config.tie_word_embeddings,
        swiglu=True, normalization="RMSNorm", norm_epsilon=config.rms_norm_eps,
        add_qkv_bias=model_type == "qwen2", add_bias_linear=False, qk_layernorm=model_type == "qwen3",
        position_embedding_type="rope", rotary_base=int(config.rope_parameters["rope_theta"]),
        rotary_percent=1.0, rotary_interleaved=False,
        max_position_embeddings=config.max_position_embeddings, seq_length=config.max_position_embeddings,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        params_dtype=torch.float32, bf16=False, fp16=False,
        hidden_dropout=0.0, attention_dropout=0.0, transformer_impl="local",
        ckpt_format="torch_dist", iteration=ITERATION,
    )


def transformer_config(args: argparse.Namespace):
    """megatron-core TransformerConfig from Megatron args (the subset a dense Llama/Qwen uses)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
        kv_channels=args.kv_channels, gated_linear_unit=args.swiglu, activation_func=F.silu,
        add_bias_linear=args.add_bias_linear, add_qkv_bias=args.add_qkv_bias, qk_layernorm=args.qk_layernorm,
        normalization=args.normalization, layernorm_epsilon=args.norm_epsilon,
        hidden_dropout=0.0, attention_dropout=0.0, rotary_interleaved=args.rotary_interleaved,
        params_dtype=args.params_dtype, bf16=args.bf16, fp16=args.fp16,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        use_cpu_initialization=True, perform_initialization=False,
        # sliding-window attention as the args say it (Mistral/Qwen exports); None: full causal attention
        window_size=tuple(args.window_size) if getattr(args, "window_size", None) else None,
        window_attn_skip_freq=getattr(args, "window_attn_skip_freq", None),
    )


def build_gpt_model(args: argparse.Namespace):
    """A GPTModel (local spec) for ``args``; model parallel state must already be initialised."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization=args.normalization, qk_layernorm=args.qk_layernorm)
    return GPTModel(
        config=transformer_config(args), transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
    ).eval()


def mcore_model_logits(model, tokens):
    """GPTModel logits [b, s, V_pad], gathered over TP.

    Positions and the causal mask are passed explicitly: mcore's default causal mask is allocated on
    cuda. The mask is boolean, True = masked, which the local DotProductAttention fills with -10000.
    """
    import torch

    seq = tokens.shape[1]
    positions = torch.arange(seq).unsqueeze(0).expand_as(tokens)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]  # True = masked
    with torch.no_grad():
        logits = model(input_ids=tokens, position_ids=positions, attention_mask=causal,
                       runtime_gather_output=True)
    return logits.float()


# --- the independent HF -> Megatron-Core conversion (MAPPING.md) --------------------------------------


def fuse_qkv(q, k, v, groups: int, layout: str = "grouped"):
    """linear_qkv from q/k/v (weights [rows, H] or biases [rows]), MAPPING.md §2.1/§2.3.

    ``grouped``: per KV group g, [q heads of g; k_g; v_g]. ``naive``: cat([q, k, v]), which is wrong
    whenever groups > 1 (kept so tests can show the logits check catches it).
    """
    import torch

    if layout == "naive":
        return torch.cat([q, k, v], dim=0)
    tail = q.shape[1:]
    q3 = q.reshape(groups, -1, *tail)
    k3 = k.reshape(groups, -1, *tail)
    v3 = v.reshape(groups, -1, *tail)
    return torch.cat([q3, k3, v3], dim=1).reshape(-1, *tail)


def pad_vocab(weight, padded: int):
    """Append zero rows up to V_pad (MAPPING.md §4.1)."""
    import torch

    extra = padded - weight.shape[0]
    assert extra >= 0, (weight.shape, padded)
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])], dim=0)


def hf_to_mcore(hf_state: dict, args: argparse.Namespace, tp_rank: int = 0, qkv_layout: str = "grouped") -> dict:
    """HF tensors -> the local-spec GPTModel parameter names and values held by TP rank ``tp_rank``.

    Column-parallel tensors (vocab, qkv, fc1) split on dim 0, row-parallel (linear_proj, fc2) on
    dim 1, norms replicated (MAPPING.md §4). QKV: whole groups per rank = chunk of the fused tensor
    (§2.2). fc1: rank t holds [gate_t; up_t] (§3.2).
    """
    import torch

    tp = args.tensor_model_parallel_size

    def col(t):
        return torch.chunk(t, tp, dim=0)[tp_rank].clone()

    def row(t):
        return torch.chunk(t, tp, dim=1)[tp_rank].clone()

    out = {"embedding.word_embeddings.weight": col(pad_vocab(hf_state["model.embed_tokens.weight"],
                                                             args.padded_vocab_size)),
           "decoder.final_layernorm.weight": hf_state["model.norm.weight"].clone()}
    if args.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = col(pad_vocab(hf_state["lm_head.weight"], args.padded_vocab_size))
    for i in range(args.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf_state[h + "input_layernorm.weight"].clone()
        out[m + "pre_mlp_layernorm.weight"] = hf_state[h + "post_attention_layernorm.weight"].clone()
        for kind in ("weight", "bias") if args.add_qkv_bias else ("weight",):
            fused = fuse_qkv(*(hf_state[f"{attn}{p}_proj.{kind}"] for p in "qkv"), args.num_query_groups,
                             qkv_layout)
            out[m + f"self_attention.linear_qkv.{kind}"] = col(fused)
        out[m + "self_attention.linear_proj.weight"] = row(hf_state[attn + "o_proj.weight"])
        if args.qk_layernorm:
            out[m + "self_attention.q_layernorm.weight"] = hf_state[attn + "q_norm.weight"].clone()
            out[m + "self_attention.k_layernorm.weight"] = hf_state[attn + "k_norm.weight"].clone()
        gate, up = hf_state[h + "mlp.gate_proj.weight"], hf_state[h + "mlp.up_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([col(gate), col(up)], dim=0)
        out[m + "mlp.linear_fc2.weight"] = row(hf_state[h + "mlp.down_proj.weight"])
    return out


def load_params(model, params: dict) -> None:
    """Copy ``params`` into the model's parameters: every parameter exactly once, shapes equal."""
    import torch

    own = dict(model.named_parameters())
    assert set(own) == set(params), (sorted(set(own) ^ set(params)))
    with torch.no_grad():
        for name, value in params.items():
            assert own[name].shape == value.shape, (name, tuple(own[name].shape), tuple(value.shape))
            own[name].copy_(value)


def max_logit_diff(hf_logits, mcore_logits, vocab: int) -> float:
    """max |hf - mcore| over the true vocab (padding columns are compared separately by callers)."""
    return float((hf_logits[..., :vocab] - mcore_logits[..., :vocab]).abs().max())


# --- process / torch.cuda plumbing ------------------------------------------------------------------

_CUDA_STUBS = {"synchronize": lambda *a, **k: None, "current_device": lambda: "cpu",
               "set_device": lambda *a, **k: None, "device_count": lambda: 1}


@contextlib.contextmanager
def cpu_megatron():
    """Stub the torch.cuda functions megatron-core calls on CPU, only for the duration of the block."""
    import torch

    saved = {name: getattr(torch.cuda, name) for name in _CUDA_STUBS}
    for name, fn in _CUDA_STUBS.items():
        setattr(torch.cuda, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)


def _prepare_megatron(tp: int) -> None:
    """Model-parallel groups and an RNG tracker whose fork() needs no CUDA (dropout is 0 anyway)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mcore_random

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    assert parallel_state.get_tensor_model_parallel_world_size() == tp
    mcore_random.initialize_rng_tracker(inference_rng_tracker=True)


def ensure_single_rank_world() -> None:
    """A gloo world of 1 in this process with TP=1 model-parallel state; created once, then reused."""
    import torch.distributed as dist

    if not dist.is_initialized():
        rendezvous = tempfile.mkdtemp(prefix="ckptscope_gloo_")
        # The world lives as long as this process (its store may use the file to the end): the
        # directory goes when the process exits, not before, and is not left behind in /tmp.
        atexit.register(shutil.rmtree, rendezvous, ignore_errors=True)
        init_file = os.path.join(rendezvous, "rendezvous")
        with cpu_megatron():
            _init_gloo(0, 1, init_file)
    with cpu_megatron():
        _prepare_megatron(1)


def megatron_common_state(args: argparse.Namespace) -> dict:
    """Non-tensor state as megatron.training.checkpointing saves it (goes to common.pt)."""
    return {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}


def _save_megatron(model, args: argparse.Namespace, root: Path, singleton_local_shards: bool = False) -> None:
    """dist_checkpointing.save of {"model": sharded_state_dict, ...} into ``root/iter_XXXXXXX``.

    ``singleton_local_shards``: the layout Megatron-LM 0.14/0.15 wrote with ``--dist-ckpt-save-pre-mcore-014``
    (per-layer keys, SwiGLU fc1 as ``linear_fc1.weight_w`` / ``weight_v``), which megatron-core 0.16 still loads."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    ckpt_dir = root / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # regenerate cleanly, never on top of an old save
        ckpt_dir.mkdir(parents=True)
    dist.barrier()
    metadata = {"singleton_local_shards": True} if singleton_local_shards else None
    dist_checkpointing.save({**megatron_common_state(args), "model": model.sharded_state_dict(metadata=metadata)},
                            str(ckpt_dir))
    dist.barrier()
    if dist.get_rank() == 0:
        (root / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


def convert_and_check(hf_dir: Path, args: argparse.Namespace, tp_rank: int = 0, qkv_layout: str = "grouped"):
    """Build a GPTModel, move the HF dir's weights in, and return (model, hf_logits, mcore_logits)."""
    model_hf = load_hf_model(hf_dir)
    tokens = tokens_for(args.vocab_size)
    hf_logits = hf_model_logits(model_hf, tokens)
    model = build_gpt_model(args)
    load_params(model, hf_to_mcore(model_hf.state_dict(), args, tp_rank, qkv_layout))
    return model, hf_logits, mcore_model_logits(model, tokens)


def _assert_logits_match(hf_logits, mcore_logits, args: argparse.Namespace, where: str) -> None:
    diff = max_logit_diff(hf_logits, mcore_logits, args.vocab_size)
    pad = float(mcore_logits[..., args.vocab_size:].abs().max()) if args.padded_vocab_size > args.vocab_size else 0.0
    if not diff <= LOGITS_ATOL or pad != 0.0:
        raise AssertionError(f"{where}: HF vs GPTModel logits differ by {diff:.3g} (atol {LOGITS_ATOL}); "
                             f"padding logits max {pad}")


def save_mcore_from_hf(hf_dir: Path, root: Path, qkv_layout: str = "grouped", check: bool = True,
                       singleton_local_shards: bool = False) -> Path:
    """Convert ``hf_dir`` into a TP=1 Megatron save root ``root`` in this process (gloo world of 1).

    ``check`` asserts the logits match before saving; tests pass ``qkv_layout="naive", check=False``
    to write a deliberately wrong checkpoint.
    """
    from transformers import AutoConfig

    args = megatron_args(AutoConfig.from_pretrained(str(hf_dir)), tp=1)
    ensure_single_rank_world()
    with cpu_megatron():
        model, hf_logits, mc_logits = convert_and_check(Path(hf_dir), args, qkv_layout=qkv_layout)
        if check:
            _assert_logits_match(hf_logits, mc_logits, args, str(root))
        _save_megatron(model, args, Path(root), singleton_local_shards=singleton_local_shards)
    return Path(root)


def _tp_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    """One TP rank of the TP=``world_size`` save; ``out`` is "<hf_dir>|<root>"."""
    import warnings

    warnings.filterwarnings("ignore")
    _init_gloo(rank, world_size, init_file)
    _stub_cuda()
    from transformers import AutoConfig

    hf_dir, root = (Path(p) for p in out.split("|"))
    args = megatron_args(AutoConfig.from_pretrained(str(hf_dir)), tp=world_size)
    _prepare_megatron(world_size)
    model, hf_logits, mc_logits = convert_and_check(hf_dir, args, tp_rank=rank)
    _assert_logits_match(hf_logits, mc_logits, args, f"{root} (rank {rank})")
    _save_megatron(model, args, root)
    import torch.distributed as dist

    dist.destroy_process_group()


def write_mcore(name: str, out: Path, tp: int = 1) -> Path:
    """``mcore_<name>/`` (``_tp<T>`` suffix when tp > 1) converted from ``hf_<name>/`` (written if missing)."""
    out = Path(out)
    hf_dir = out / f"hf_{name}"
    if not (hf_dir / "config.json").exists():
        write_hf(name, out)
    root = out / (f"mcore_{name}" if tp == 1 else f"mcore_{name}_tp{tp}")
    if tp == 1:
        save_mcore_from_hf(hf_dir, root)
    else:
        _spawn(_tp_rank, f"{hf_dir}|{root}", world_size=tp)  # type: ignore[arg-type]
    return root


def write_pair(name: str, out: Path, tp: int = 1) -> tuple[Path, Path]:
    """Both halves of one pair: (hf_<name>/, mcore_<name>/)."""
    hf_dir = write_hf(name, Path(out))
    return hf_dir, write_mcore(name, Path(out), tp)


def _writer(name: str, kind: str, tp: int = 1):
    if kind == "hf":
        return lambda out: write_hf(name, Path(out))
    return lambda out: write_mcore(name, Path(out), tp)


WRITERS = {}
for _name in ARCHS:
    WRITERS[f"hf_{_name}"] = _writer(_name, "hf")
    WRITERS[f"mcore_{_name}"] = _writer(_name, "mcore")
WRITERS["mcore_llama_gqa_tp2"] = _writer("llama_gqa", "mcore", tp=2)

# What ships in sample_ckpts/ by default (kept under 1 MB); the rest is for tests into tmp dirs.
SHIPPED = ("hf_llama_gqa", "mcore_llama_gqa")


def main(argv: list[str] | None = None) -> int:
    from make_samples import run_writers

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--only" not in argv:
        argv += ["--only", *SHIPPED]
    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
