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
mappings (``utils/yaml_utils.py``), the model provider is the ``model`` section. It is read here with
``yaml.safe_load`` only: ``_target_`` stays a string, nothing is imported or called, and a YAML tag that
asks for a Python object is an error, not an instruction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry

RUN_CONFIG_FILE = "run_config.yaml"
OBJECT_NAME = "run_config"
"""The index object holding the parsed file (``core.roles`` files ``run_config`` under args)."""
MAX_BYTES = 16 << 20
"""A run config is a few hundred KiB at most; anything far larger is not one and is not parsed."""


def read_run_config(path: Path, what: str = "Megatron-Bridge run config") -> dict[str, Any]:
    """The parsed ``run_config.yaml`` (or another config YAML of the same kind, ``what``) at ``path``;
    ValueError (with the reason) when it cannot be used."""
    try:
        import yaml
    except ImportError as exc:  # PyYAML is not a ckptscope dependency; transformers and Megatron-Bridge bring it
        raise ValueError("PyYAML is not installed (pip install pyyaml), so the run config cannot be read") from exc
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ValueError(f"{size} bytes: too large for a {what}")
    try:
        with path.open("r", encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"not plain YAML ({first})") from exc
    if not isinstance(data, dict):
        raise ValueError("not a mapping of config sections")
    return data


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


NEMO_WEIGHTS, NEMO_CONTEXT, NEMO_MODEL_FILE = "weights", "context", "model.yaml"
NEMO_OBJECT = "nemo_model"
"""The index object holding a NeMo 2.0 checkpoint's parsed ``context/model.yaml``."""


def add_nemo_context(index: CheckpointIndex, weights_dir: Path) -> None:
    """A NeMo 2.0 checkpoint (``<ckpt>/weights/`` torch_dist beside ``<ckpt>/context/``): its model config.

    NeMo keeps no Megatron ``args`` in ``common.pt``. ``IOMixin.io_dump`` (``nemo/lightning/io/mixin.py``)
    writes the model's construction as ``context/io.json`` (fiddle) and, through nemo_run's YAML serialiser,
    as ``context/model.yaml``: ``_target_`` the model class, ``config`` its ``GPTConfig`` (a megatron-core
    ``TransformerConfig``) with every field, defaults included, functions and dtypes as ``{_target_, _call_}``
    mappings, as Megatron-Bridge's ``run_config.yaml`` writes its model section. It is read the same way
    (``yaml.safe_load``, nothing imported or called) into the ``nemo_model`` object; its ``vocab_size`` is
    usually null (NeMo takes it from the tokenizer when the model is built)."""
    path = weights_dir.parent / NEMO_CONTEXT / NEMO_MODEL_FILE
    if weights_dir.name != NEMO_WEIGHTS or not path.is_file():
        return
    where = f"{NEMO_CONTEXT}/{NEMO_MODEL_FILE}"
    try:
        data = read_run_config(path, "NeMo model.yaml")
    except (OSError, ValueError) as exc:
        index.warnings.append(f"{where} (beside weights/): {exc}; the model config it holds is unknown")
        return
    index.objects.append(ObjectEntry(NEMO_OBJECT, "dict", data))
