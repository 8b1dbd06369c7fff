"""A config YAML some trainers write beside their weights (Megatron-Bridge's ``run_config.yaml``, NeMo 2.0's
``context/model.yaml``, a NeMo 1.x ``.nemo``'s ``model_config.yaml``), read as data and nothing more.

``yaml.safe_load`` only: ``_target_`` class paths stay strings, nothing is imported or called, and a YAML
tag that asks for a Python object is an error, not an instruction.
"""

from __future__ import annotations

from typing import IO, Any

MAX_BYTES = 16 << 20
"""Such a config is a few hundred KiB at most; anything far larger is not one and is not parsed."""


def load_config_yaml(source: IO[str] | IO[bytes], size: int, what: str) -> dict[str, Any]:
    """The mapping the YAML in ``source`` (``size`` bytes; text or binary) holds; ValueError (with the reason,
    naming ``what``) when it cannot be used."""
    try:
        import yaml
    except ImportError as exc:  # PyYAML is not a ckptscope dependency; transformers and Megatron-Bridge bring it
        raise ValueError(f"PyYAML is not installed (pip install pyyaml), so the {what} cannot be read") from exc
    if size > MAX_BYTES:
        raise ValueError(f"{size} bytes: too large for a {what}")
    try:
        data = yaml.safe_load(source)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"not plain YAML ({first})") from exc
    if not isinstance(data, dict):
        raise ValueError("not a mapping of config sections")
    return data
