"""A PEFT adapter directory: ``adapter_config.json`` + ``adapter_model.safetensors`` (or the older
``adapter_model.bin``), as ``PeftModel.save_pretrained`` writes it.

It sniffs before the generic HF dir reader (which would take any dir holding a ``*.safetensors``).
Tensors are shown as stored (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``);
``adapter_config.json`` is an object; ``metadata["lora"]`` describes the A/B pairs (``peft.lora``),
and one ``lora`` object per target module kind (``q_proj: 2 layers, r=8, alpha=16, scale=2``) puts
that summary in every view that lists objects. Reading the index never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, Issue, ObjectEntry
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.hf.side_files import add_side_files
from ckptscope.formats.peft.lora import describe_lora
from ckptscope.formats.registry import register_reader
from ckptscope.formats.safetensors.reader import note_header, parse_safetensors_header

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_BIN = "adapter_model.bin"


def _load_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CkptError(f"bad JSON: {exc}", path) from None
    if not isinstance(data, dict):
        raise CkptError("adapter config is not a JSON object", path)
    return data


@register_reader
class PeftAdapterReader(CheckpointReader):
    """``PeftModel.save_pretrained`` output (LoRA)."""

    format_name = "peft"
    priority = 15

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            return path.is_dir() and (path / ADAPTER_CONFIG).is_file() and (
                (path / ADAPTER_SAFETENSORS).is_file() or (path / ADAPTER_BIN).is_file())
        except OSError:
            return False

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        config = _load_config(self.path / ADAPTER_CONFIG)
        if (self.path / ADAPTER_SAFETENSORS).is_file():
            weights = ADAPTER_SAFETENSORS
            header = parse_safetensors_header(self.path / weights, weights)
            index.tensors.update(header.tensors)
            note_header(index, header, weights)
            if header.metadata:
                index.metadata["__metadata__"] = header.metadata
            if (self.path / ADAPTER_BIN).is_file():
                index.warnings.append(f"{ADAPTER_BIN} is present too; showing {ADAPTER_SAFETENSORS}")
        else:
            weights = ADAPTER_BIN
            self._index_bin(index)
        index.metadata["weights"] = weights
        add_side_files(index, self.path)  # adapter_config.json, tokenizer, and a Trainer checkpoint's state
        for i, info in enumerate(index.files):
            if info.path == weights and info.role != "data":  # a .bin adapter whose chunks name another file
                index.files[i] = FileInfo(info.path, info.size, "data")
        lora = describe_lora(config, index.tensors)
        index.metadata["lora"] = lora
        index.metadata["peft_type"] = lora["peft_type"]
        if lora["base_model_name_or_path"]:
            index.metadata["base_model_name_or_path"] = lora["base_model_name_or_path"]
        for kind, summary in lora["modules"].items():
            index.objects.append(ObjectEntry(f"lora.{kind}", "lora", summary["line"]))
        index.warnings.extend(w for w in lora["warnings"] if w not in index.warnings)
        # an incomplete pair or a rank the config contradicts: PEFT cannot load the adapter as saved (check said ok)
        index.issues.extend(Issue("inconsistent-adapter", detail, weights) for detail in lora["damage"])
        return index

    def _index_bin(self, index: CheckpointIndex) -> None:
        """The older ``adapter_model.bin`` (a ``torch.save`` state dict), read by the stub unpickler."""
        from ckptscope.formats.pickles.torch_file import build_torch_index, is_torch_zip, read_torch_zip

        path = self.path / ADAPTER_BIN
        if not is_torch_zip(path):
            raise CkptError("adapter_model.bin is not a torch.save zip file (legacy pickles are not read here)", path)
        parsed = read_torch_zip(path)
        part = CheckpointIndex(path=str(path), format="torch")
        build_torch_index(part, parsed.obj, ADAPTER_BIN, parsed.storages, big_endian=parsed.big_endian, path=path)
        index.tensors.update(part.tensors)
        index.objects.extend(ObjectEntry(f"{ADAPTER_BIN}:{o.name}", o.type, o.value) for o in part.objects)
        index.warnings.extend(w for w in part.warnings if w not in index.warnings)
