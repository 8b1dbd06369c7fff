"""A NeMo 2.0 checkpoint's model config: ``context/model.yaml`` beside its torch_dist ``weights/``.

NeMo keeps no Megatron ``args`` in ``common.pt``. ``IOMixin.io_dump`` (``nemo/lightning/io/mixin.py``)
writes the model's construction as ``context/io.json`` (fiddle) and, through nemo_run's YAML serialiser, as
``context/model.yaml``: ``_target_`` the model class, ``config`` its ``GPTConfig`` (a megatron-core
``TransformerConfig``) with every field, defaults included, functions and dtypes as ``{_target_, _call_}``
mappings, as Megatron-Bridge's ``run_config.yaml`` writes its model section (``run_config.py``), and it is
read the same way (``yaml.safe_load``, nothing imported or called). Its ``vocab_size`` is usually null
(NeMo takes it from the tokenizer when the model is built).
"""

from __future__ import annotations

from pathlib import Path

from ckptscope.core.index import CheckpointIndex, ObjectEntry
from ckptscope.formats.megatron.run_config import read_run_config

NEMO_WEIGHTS, NEMO_CONTEXT, NEMO_MODEL_FILE = "weights", "context", "model.yaml"
NEMO_OBJECT = "nemo_model"
"""The index object holding the parsed ``context/model.yaml``."""


def add_nemo_context(index: CheckpointIndex, weights_dir: Path) -> None:
    """Add ``<ckpt>/context/model.yaml`` to the index of ``<ckpt>/weights/`` as the ``nemo_model`` object
    (when ``weights_dir`` is a NeMo checkpoint's weights); a file that cannot be read is a warning."""
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
