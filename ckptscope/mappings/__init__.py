"""HF <-> Megatron-Core name tables and reversible transforms (filled by the convert/diff issues).

Architectures with their own module register into the shared tables here, once, on first import.
"""

from ckptscope.mappings import deepseek as _deepseek  # noqa: F401  (registers deepseek_v3 on import)
from ckptscope.mappings import glm4_moe as _glm4_moe  # noqa: F401  (registers glm4_moe on import)
from ckptscope.mappings import gpt_oss as _gpt_oss
from ckptscope.mappings import llama4 as _llama4

_gpt_oss.register()
_llama4.register()
