"""HF <-> Megatron-Core name tables and reversible transforms (filled by the convert/diff issues)."""

from ckptscope.mappings import deepseek as _deepseek  # noqa: E402,F401  (registers deepseek_v3 into SCHEMAS)
