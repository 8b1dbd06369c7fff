"""verl's JSON side files (FSDP ``fsdp_config.json``, ``huggingface/config.json``, the v2 manifest
``ckpt_contents.json``), read so that a bad one is a warning on the checkpoint, never a failure:
the weights beside it are still worth showing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def json_file(path: Path) -> tuple[Any, str | None]:
    """Parsed JSON, or ``(None, problem)``."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except OSError as exc:
        return None, f"{path.name}: cannot read: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{path.name}: bad JSON: {exc}"
