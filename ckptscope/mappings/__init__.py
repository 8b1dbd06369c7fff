"""HF <-> Megatron-Core name tables and reversible transforms (filled by the convert/diff issues).

Architectures with their own module register into the shared tables here, once, on first import.
"""

from ckptscope.mappings import deepseek as _deepseek  # noqa: F401  (registers deepseek_v3 on import)
from ckptscope.mappings import glm4_moe as _glm4_moe  # noqa: F401  (registers glm4_moe on import)
from ckptscope.mappings import gpt_oss as _gpt_oss
from ckptscope.mappings import llama4 as _llama4

_gpt_oss.register()
_llama4.register()

from ckptscope.mappings import config as _config
from ckptscope.mappings import rope as _rope


def _with_rope_check(arch: str):
    """``MEGATRON_CHECKS`` entry of ``arch``: its own checks plus the RoPE scaling's (mappings/rope.py)."""
    own = _config.MEGATRON_CHECKS.get(arch)
    mla = arch in _config.MLA_ARCHS

    def check(cfg: _config.ModelConfig) -> list[str]:
        return (own(cfg) if own else []) + _rope.problems(cfg, mla=mla)

    return check


for _arch in set(_config.ARCH_BY_MODEL_TYPE.values()) - _config.ROPE_CARRIED_BY_ARCH:
    _config.MEGATRON_CHECKS[_arch] = _with_rope_check(_arch)
