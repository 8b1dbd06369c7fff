"""megatron-core's own MLA GPTModel on CPU, for the DeepSeek-V3 tests (tests/test_deepseek.py) and the 2-rank
references they spawn (importable by name so spawned ranks find it).

``gpt_model(args, mtp=...)`` builds the GPTModel a Megatron-LM run with these args would build
(``core_transformer_config_from_args`` for the fields a DeepSeek-V3 model uses) from megatron-core's own
layer specs (``get_gpt_decoder_block_spec`` / ``get_gpt_mtp_block_spec``, local implementations). Three
shims let megatron-core 0.16.1 run without TransformerEngine on CPU; none touches a weight or a name:

* ``multi_latent_attention.HAVE_TE`` is set False: megatron-core's TE import shim leaves MagicMocks
  behind, which MLA's ``isinstance(self.linear_proj, TELinear)`` check trips over;
* ``moe_utils.te_general_gemm`` gets the None fallback its router path tests for;
* MLA's core attention is megatron-core's own ``DotProductAttention`` minus the ``k_channels`` /
  ``v_channels`` arguments only TE's attention takes (the local one computes with whatever head sizes
  q, k and v have, and MLA hands it its softmax scale).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "sample_ckpts") not in sys.path:
    sys.path.insert(0, str(REPO / "sample_ckpts"))


def _shim() -> tuple:
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.multi_latent_attention as mla

    saved = mla.HAVE_TE, moe_utils.__dict__.get("te_general_gemm", "missing")
    mla.HAVE_TE = False
    if saved[1] == "missing":
        moe_utils.te_general_gemm = None
    return saved


def _unshim(saved: tuple) -> None:
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.multi_latent_attention as mla

    mla.HAVE_TE = saved[0]
    if saved[1] == "missing":
        del moe_utils.te_general_gemm


@contextlib.contextmanager
def megatron_on_cpu():
    """A gloo world of 1 with TP=1 state, the torch.cuda stubs and the shims above, undone afterwards."""
    from make_mcore_pair_samples import cpu_megatron, ensure_single_rank_world

    saved = _shim()
    ensure_single_rank_world()
    try:
        with cpu_megatron():
            yield
    finally:
        _unshim(saved)


def _core_attention():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class CoreAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    return CoreAttention


YARN_FIELDS = ("rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
               "mscale_all_dim")
"""MLATransformerConfig's YaRN fields, taken from the args when they carry them (else its defaults)."""


def gpt_model(args, *, mtp: bool, tp: int = 1):
    """megatron-core's GPTModel for a DeepSeek-V3 checkpoint's own ``args`` (parallel state must be set)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, kv_channels=args.kv_channels,
        multi_latent_attention=args.multi_latent_attention, q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank, qk_head_dim=args.qk_head_dim, qk_pos_emb_head_dim=args.qk_pos_emb_head_dim,
        v_head_dim=args.v_head_dim, qk_layernorm=args.qk_layernorm, rope_type=args.rope_type,
        rotary_base=args.rotary_base, rotary_interleaved=args.rotary_interleaved,
        num_moe_experts=args.num_experts, moe_ffn_hidden_size=args.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
        moe_router_topk=args.moe_router_topk, moe_layer_freq=args.moe_layer_freq,
        moe_router_enable_expert_bias=args.moe_router_enable_expert_bias,
        moe_router_score_function=args.moe_router_score_function,
        moe_router_topk_scaling_factor=args.moe_router_topk_scaling_factor,
        moe_router_num_groups=args.moe_router_num_groups, moe_router_group_topk=args.moe_router_group_topk,
        mtp_num_layers=args.mtp_num_layers if mtp else None, normalization=args.normalization,
        layernorm_epsilon=args.norm_epsilon, gated_linear_unit=args.swiglu, activation_func=F.silu,
        add_bias_linear=args.add_bias_linear, hidden_dropout=0.0, attention_dropout=0.0,
        moe_token_dispatcher_type="allgather", use_cpu_initialization=True, perform_initialization=False,
        params_dtype=torch.float32, tensor_model_parallel_size=tp,
        **{k: getattr(args, k) for k in YARN_FIELDS if getattr(args, k, None) is not None})
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=args.normalization)
    for layer in spec.layer_specs:
        layer.submodules.self_attention.submodules.core_attention = _core_attention()
    mtp_spec = get_gpt_mtp_block_spec(config, spec.layer_specs[-1], use_transformer_engine=False) if mtp else None
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    position_embedding_type="rope", rotary_base=args.rotary_base, mtp_block_spec=mtp_spec).eval()


# --- 2 gloo ranks: what megatron-core holds per TP rank after loading a torch_dist dir ----------------------


def _tp2_case(case: dict, dist_dirs: dict[str, str]):
    import argparse

    import torch
    from make_mcore_rank_refs import prepare_parallel

    dist_dir = dist_dirs[case["name"]]
    args = torch.load(Path(dist_dir) / "common.pt", map_location="cpu", weights_only=False)["args"]
    args = argparse.Namespace(**{**vars(args), "tensor_model_parallel_size": case["tp"],
                                 "padded_vocab_size": case["padded_vocab_size"]})
    prepare_parallel(case["tp"], 1)
    return args, gpt_model(args, mtp=True, tp=case["tp"]), dist_dir


def _tp2_rank(rank: int, world_size: int, out: str, init_file: str) -> None:
    from make_mcore_rank_refs import run_reference_cases

    _shim()
    run_reference_cases(rank, world_size, out, init_file, _tp2_case)


def tp2_references(dist_dirs: dict[str, Path], out: Path, padded_vocab_size: int) -> Path:
    """``out/<name>/mp_rank_0{t}/reference.pt``: megatron-core's ``state_dict_for_save_checkpoint()`` on TP
    rank t of a TP=2 model that loaded ``dist_dirs[name]`` (an iteration dir) through dist_checkpointing."""
    from make_mcore_rank_refs import spawn_references

    cases = [{"name": name, "tp": 2, "pp": 1, "padded_vocab_size": padded_vocab_size} for name in dist_dirs]
    return spawn_references(_tp2_rank, dist_dirs, out, cases)


__all__ = ["gpt_model", "megatron_on_cpu", "tp2_references"]
