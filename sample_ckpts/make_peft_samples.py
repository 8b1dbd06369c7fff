#!/usr/bin/env python
"""Write tiny PEFT LoRA adapters (and the base model beside them) with the real writers.

    python sample_ckpts/make_peft_samples.py [OUT_DIR] [--only NAME ...]   # default: sample_ckpts/

``peft_llama_base`` is a tiny transformers Llama saved with ``save_pretrained`` (float32).
``peft_lora`` is ``peft.get_peft_model(base, LoraConfig(r=4, lora_alpha=8,
target_modules=[q_proj, v_proj, down_proj]))`` saved with ``PeftModel.save_pretrained``
(``adapter_model.safetensors`` + ``adapter_config.json``); ``peft_lora_rslora`` is the same with
``use_rslora=True`` (scale alpha/sqrt(r)) and a ``rank_pattern``/``alpha_pattern`` entry; ``peft_lora_dora`` is DoRA
(shown, refused by ``lora merge``). ``peft_gpt2_lora`` adapts ``peft_gpt2_base``'s ``Conv1D`` layers
with ``fan_in_fan_out=True``, ``bias="lora_only"`` and ``lora_bias=True``. PEFT
initialises ``lora_B`` to zero (the adapter starts as a no-op), so B gets seeded random values
here: a merge then changes the weights. Every sample is deterministic (fixed seeds).
"""

from __future__ import annotations

import sys
from pathlib import Path

TINY_PEFT_LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
TARGET_MODULES = ["q_proj", "v_proj", "down_proj"]
BASE = "peft_llama_base"


def tiny_base(seed: int = 0):
    """The base model: a 2-layer GQA Llama, float32, random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY_PEFT_LLAMA)).to(torch.float32).eval()


def lora_model(seed: int = 0, **config):
    """``get_peft_model`` on the base, with every ``lora_B`` set to seeded random values."""
    import torch
    from peft import LoraConfig, get_peft_model

    base = tiny_base(seed)
    torch.manual_seed(seed + 100)
    model = get_peft_model(base, LoraConfig(target_modules=list(TARGET_MODULES), lora_dropout=0.0, **config))
    generator = torch.Generator().manual_seed(seed + 200)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


def write_base(out: Path) -> Path:
    target = out / BASE
    tiny_base().save_pretrained(target)
    return target


def write_lora(out: Path) -> Path:
    target = out / "peft_lora"
    lora_model(r=4, lora_alpha=8).save_pretrained(target)
    return target


def write_lora_rslora(out: Path) -> Path:
    """use_rslora: scale lora_alpha / sqrt(r); v_proj of layer 1 gets its own rank and alpha."""
    target = out / "peft_lora_rslora"
    lora_model(r=4, lora_alpha=8, use_rslora=True, rank_pattern={"layers.1.self_attn.v_proj": 2},
               alpha_pattern={"layers.1.self_attn.v_proj": 6}).save_pretrained(target)
    return target


def write_lora_dora(out: Path) -> Path:
    """DoRA (``lora_magnitude_vector``): ckptscope shows it but refuses to merge it."""
    target = out / "peft_lora_dora"
    lora_model(r=4, lora_alpha=8, use_dora=True).save_pretrained(target)
    return target


TINY_GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0}
GPT2_BASE = "peft_gpt2_base"


def tiny_gpt2(seed: int = 0):
    """A 2-layer GPT-2: its attention and MLP are ``Conv1D`` with weights stored ``[in, out]``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).to(torch.float32).eval()


def write_gpt2_base(out: Path) -> Path:
    target = out / GPT2_BASE
    tiny_gpt2().save_pretrained(target)
    return target


def write_gpt2_lora(out: Path) -> Path:
    """``fan_in_fan_out=True`` on GPT-2's ``c_attn``/``c_fc`` with ``bias="lora_only"`` (the adapted
    modules' biases are trained and saved, here set to new values) and ``lora_bias=True`` (lora_B has
    a bias too)."""
    import torch
    from peft import LoraConfig, get_peft_model

    base = tiny_gpt2()
    torch.manual_seed(300)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], lora_dropout=0.0,
                                            fan_in_fan_out=True, bias="lora_only", lora_bias=True))
    generator = torch.Generator().manual_seed(400)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name or (name.endswith(".bias") and param.requires_grad):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    target = out / "peft_gpt2_lora"
    model.eval().save_pretrained(target)
    return target


GPT2_UNTIED_BASE = "peft_gpt2_untied_base"


def write_gpt2_untied_base(out: Path) -> Path:
    """GPT-2 with its own ``lm_head.weight`` (``tie_word_embeddings=False``), an ``nn.Linear`` beside the
    ``Conv1D`` projections."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    target = out / GPT2_UNTIED_BASE
    GPT2LMHeadModel(GPT2Config(**TINY_GPT2, tie_word_embeddings=False)).to(torch.float32).eval().save_pretrained(target)
    return target


def write_gpt2_mixed_lora(out: Path) -> Path:
    """LoRA on GPT-2's square ``attn.c_proj`` (``Conv1D``) and on ``lm_head`` (``nn.Linear``), asked with
    ``fan_in_fan_out=True``: PEFT sets the flag per module by type and the config keeps what the last
    module wrapped (lm_head) left, ``false``, although ``c_proj`` is merged transposed."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(out / GPT2_UNTIED_BASE)
    torch.manual_seed(301)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["attn.c_proj", "lm_head"],
                                            lora_dropout=0.0, fan_in_fan_out=True))
    generator = torch.Generator().manual_seed(401)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    target = out / "peft_gpt2_mixed_lora"
    model.eval().save_pretrained(target, save_embedding_layers=False)
    return target


def _nudge(model, *parts: str, seed: int) -> None:
    """Move every parameter whose name holds one of ``parts`` off the base's values (as training would)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in parts):
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def write_lora_modules_to_save(out: Path) -> Path:
    """LoRA on the attention plus ``modules_to_save=["lm_head"]``: PEFT trains a full copy of lm_head and
    saves it as ``base_model.model.lm_head.weight``; ``merge_and_unload`` puts that copy in the base's place."""
    model = lora_model(r=4, lora_alpha=8, modules_to_save=["lm_head"])
    _nudge(model, "modules_to_save.default", seed=501)
    target = out / "peft_lora_modules_to_save"
    model.save_pretrained(target)
    return target


def write_lora_saved_embeddings(out: Path) -> Path:
    """LoRA on q/v and on ``lm_head``, saved with ``save_embedding_layers=True`` after the head's base weight
    moved: the adapter holds ``...lm_head.base_layer.weight`` whole (PEFT 0.21 saves the targeted layer's, not
    the untargeted embedding), which PEFT loads over the base's before it merges lm_head's pair."""
    import torch
    from peft import LoraConfig, get_peft_model

    base = tiny_base()
    torch.manual_seed(502)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"],
                                            lora_dropout=0.0))
    _nudge(model, ".lora_B.", "embed_tokens.weight", "lm_head.base_layer.weight", seed=503)
    target = out / "peft_lora_saved_embeddings"
    model.eval().save_pretrained(target, save_embedding_layers=True)
    return target


def write_lora_saved_untargeted_embeddings(out: Path) -> Path:
    """LoRA on q/v only, saved with ``save_embedding_layers=True`` after the embedding and the head moved (a
    vocabulary edit, trained embeddings): the adapter holds ``...embed_tokens.weight`` and ``...lm_head.weight``
    whole, which PEFT loads over the base's."""
    model = lora_model(r=4, lora_alpha=8)
    _nudge(model, "embed_tokens.weight", "lm_head.weight", seed=504)
    target = out / "peft_lora_saved_untargeted_embeddings"
    model.save_pretrained(target, save_embedding_layers=True)
    return target


def write_alora(out: Path) -> Path:
    """aLoRA (``alora_invocation_tokens``): plain LoRA tensors, but the update applies only after the
    invocation tokens, so it has no merged form (PEFT's ``merge_and_unload`` raises)."""
    target = out / "peft_alora"
    lora_model(r=4, lora_alpha=8, alora_invocation_tokens=[5, 6]).save_pretrained(target)
    return target


WRITERS = {
    BASE: write_base,
    GPT2_BASE: write_gpt2_base,
    GPT2_UNTIED_BASE: write_gpt2_untied_base,
    "peft_gpt2_mixed_lora": write_gpt2_mixed_lora,
    "peft_alora": write_alora,
    "peft_gpt2_lora": write_gpt2_lora,
    "peft_lora": write_lora,
    "peft_lora_rslora": write_lora_rslora,
    "peft_lora_dora": write_lora_dora,
    "peft_lora_modules_to_save": write_lora_modules_to_save,
    "peft_lora_saved_embeddings": write_lora_saved_embeddings,
    "peft_lora_saved_untargeted_embeddings": write_lora_saved_untargeted_embeddings,
}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_samples import run_writers

    return run_writers(WRITERS, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
