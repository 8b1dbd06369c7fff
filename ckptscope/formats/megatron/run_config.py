"""Megatron-Bridge's ``run_config.yaml``: the run's whole configuration, written into each iteration dir.

Megatron-Bridge (``src/megatron/bridge/training/checkpointing.py``, ``save_checkpoint``: the rank-0
``train_state_finalize_fn``) saves ``iter_XXXXXXX/`` with megatron-core's ``dist_checkpointing`` and then
writes beside it ``train_state.pt``, ``run_config.yaml`` (``cfg.to_yaml``, ``CONFIG_FILE`` in
``training/utils/checkpoint_utils.py``) and, in the save root, ``latest_train_state.pt`` and the Megatron-LM
tracker ``latest_checkpointed_iteration.txt``. Its ``common.pt`` holds no ``args`` (``generate_state_dict``
puts ``checkpoint_version``, ``iteration``, the optimizer and RNG state there), so the model's
configuration, zero-centred norms included, is only in ``run_config.yaml``.

The YAML is ``ConfigContainer.to_dict()`` through ``yaml.safe_dump`` (``_ConfigContainerBase.to_yaml`` in
``training/utils/config_utils.py``; Megatron-LM's ``ConfigContainerBase`` in newer releases): each
dataclass is a mapping with a ``_target_`` class path, functions and dtypes are ``{_target_, _call_}``
mappings (``utils/yaml_utils.py``), the model provider is the ``model`` section. It is read as data only
(``formats.config_yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.formats.config_yaml import load_config_yaml

RUN_CONFIG_FILE = "run_config.yaml"
OBJECT_NAME = "run_config"
"""The index object holding the parsed file (``core.roles`` files ``run_config`` under args)."""


def read_run_config(path: Path, what: str = "Megatron-Bridge run config") -> dict[str, Any]:
    """The parsed ``run_config.yaml`` (or another config YAML of the same kind, ``what``) at ``path``;
    ValueError (with the reason) when it cannot be used (``formats.config_yaml``)."""
    with path.open("r", encoding="utf-8") as handle:
        return load_config_yaml(handle, path.stat().st_size, what)


def add_run_config(index: CheckpointIndex, iter_dir: Path) -> None:
    """Add ``iter_dir/run_config.yaml`` to ``index`` as the ``run_config`` object (when there is one)."""
    path = iter_dir / RUN_CONFIG_FILE
    if not path.is_file():
        return
    index.files.append(FileInfo(RUN_CONFIG_FILE, path.stat().st_size, "config"))
    try:
        data = read_run_config(path)
    except (OSError, ValueError) as exc:
        index.add_issue("unreadable-file", f"{exc}; the model config it holds is unknown", file=RUN_CONFIG_FILE)
        return
    index.objects.append(ObjectEntry(OBJECT_NAME, "dict", data))
