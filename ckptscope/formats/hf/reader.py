"""A Hugging Face model directory: safetensors shards (+ index) or ``pytorch_model*.bin`` (+ index).

FORMATS.md §1.5. The index's ``weight_map`` is checked against the shards it names: a missing
or truncated shard, a tensor the index places in a shard that lacks it, or a stored tensor the
index leaves out, is recorded as an issue (and a warning) naming both, and the rest stays
browsable; ``ckptscope check`` reports them. Config and generation files become objects;
tokenizer files are listed.

An HF Trainer ``checkpoint-N/`` dir is this format too, with the Trainer's files next to the model:
``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state[_R].pth`` and ``training_args.bin`` are
listed with their roles (never unpickled, except ``training_args.bin``, whose arguments are shown
through the safe stub unpickler), ``trainer_state.json`` becomes an object and its ``global_step`` the
iteration. ``Trainer._save_checkpoint`` writes ``trainer_state.json`` last, so a Trainer checkpoint
without it is recorded as incomplete (a ``missing-marker`` issue). A DeepSpeed ``global_stepN/`` dir
and its ``latest`` tracker (and an FSDP ``optimizer_N/`` dir) are listed file by file.
"""

from __future__ import annotations

import re

from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, Issue, ObjectEntry, mark_config_tie
from ckptscope.core.names import natural_key
from ckptscope.core.tensor import TensorMeta
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.pickles.torch_file import build_torch_index, is_torch_zip, read_torch_zip
from ckptscope.formats.pickles.trusted import TrustedTorchFile
from ckptscope.formats.registry import register_reader
from ckptscope.formats.hf.side_files import add_side_files, load_json
from ckptscope.formats.hf.quantization import unhandled_quantization
from ckptscope.formats.safetensors.reader import SafetensorsHeader, note_header, parse_safetensors_header
from ckptscope.formats.torch_save.legacy_reader import TorchLegacyReader, read_legacy

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
def _safetensors_files(path: Path) -> list[Path]:
    return sorted((p for p in path.glob("*.safetensors") if p.is_file()), key=lambda p: natural_key(p.name))


FSDP_LOCAL_SHARD = re.compile(r"^pytorch_model_fsdp_rank\d+\.bin$")
"""accelerate's FSDP1 ``LOCAL_STATE_DICT`` save: each rank's flat parameters (a ShardedTensor of the
FlatParameter) in one file per rank: not a state dict of named weights."""
FSDP_RANK_FILE = re.compile(r"^pytorch_model_fsdp_\d+_rank\d+\.bin$")
"""One rank's part of an accelerate FSDP save (``formats.verl.accelerate_ranks``), never an HF weights file."""


def _bin_files(path: Path) -> list[Path]:
    return sorted((p for p in path.glob("pytorch_model*.bin")
                   if p.is_file() and not FSDP_LOCAL_SHARD.match(p.name) and not FSDP_RANK_FILE.match(p.name)),
                  key=lambda p: natural_key(p.name))


ACCELERATE_MORE_MODELS = re.compile(r"^(?:model|pytorch_model)_(\d+)\.(?:safetensors|bin)$")
"""accelerate's ``save_state`` with several prepared models: ``model.safetensors`` (or ``pytorch_model.bin``)
for the first, ``model_1.safetensors`` ... for the others (sharded HF files are ``model-00001-of-...``)."""


def _accelerate_models(files: list[Path], first: str) -> tuple[list[Path], list[Path]]:
    """``files`` without the other models of an accelerate multi-model ``save_state``, and those."""
    more = [p for p in files if ACCELERATE_MORE_MODELS.match(p.name)]
    if not more or not any(p.name == first for p in files):
        return files, []
    return [p for p in files if p not in more], more


def _fsdp_local_shards(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("pytorch_model_fsdp_rank*.bin") if FSDP_LOCAL_SHARD.match(p.name))


def _pick_index(path: Path, canonical: str, pattern: str) -> Path | None:
    if (path / canonical).is_file():
        return path / canonical
    candidates = sorted(path.glob(pattern))
    return candidates[0] if candidates else None


def _read_weight_map(index_path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    data = load_json(index_path)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not set(map(type, weight_map.values())) <= {str}:
        raise CkptError("index file has no valid weight_map", index_path)
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    return weight_map, metadata  # JSON object keys are always str


_NUMBERED_SHARD = re.compile(r"(?P<stem>.+)-(?P<k>\d{5})-of-(?P<n>\d{5})\.(?P<ext>safetensors|bin)\Z")


def missing_numbered_shards(names: list[str]) -> list[str]:
    """The shards missing from files named ``model-0000K-of-0000N``: every K of 1..N must be there."""
    groups: dict[tuple[str, str, str], set[int]] = {}
    for name in names:
        m = _NUMBERED_SHARD.match(name)
        if m:
            groups.setdefault((m["stem"], m["n"], m["ext"]), set()).add(int(m["k"]))
    return [f"{stem}-{k:05d}-of-{n}.{ext}" for (stem, n, ext), have in groups.items()
            for k in range(1, int(n) + 1) if k not in have]


def _missing_numbered_shards(index: CheckpointIndex, names: list[str]) -> None:
    """Shards with no index to list them: ``save_pretrained`` writes the index last, so a save cut short has
    some shards and no index; it was read as a smaller model, check ok (a reviewer, on verl's ``huggingface/``)."""
    for name in missing_numbered_shards(names):
        index.add_issue("missing-file", "missing: the shards are numbered and no index lists them (a save cut "
                        "short writes no index)", file=name)


@register_reader
class HFDirReader(CheckpointReader):
    """``save_pretrained`` output, sharded or not."""

    format_name = "hf"
    priority = 60

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        super().__init__(path, trust_pickle=trust_pickle)
        self._trusted_shards: dict[str, TrustedTorchFile] = {}
        """Shards loaded with torch when the user passed --trust-pickle."""

    @classmethod
    def supports(cls, path: Path) -> bool:
        if not path.is_dir():
            return False
        return bool(
            (path / SAFETENSORS_INDEX).is_file() or _safetensors_files(path)
            or (path / BIN_INDEX).is_file() or _bin_files(path) or _fsdp_local_shards(path)
        )

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        st_files = _safetensors_files(self.path)
        st_index = _pick_index(self.path, SAFETENSORS_INDEX, "*.safetensors.index*.json")
        if st_files or st_index:
            index.metadata["weights"] = "safetensors"
            if st_index is None:
                st_files, more = _accelerate_models(st_files, "model.safetensors")
                self._note_more_models(index, "model.safetensors", more)
            self._index_safetensors(index, st_index, st_files)
            # (accelerate's FSDP FULL_STATE_DICT copy, pytorch_model_fsdp.bin, beside a Trainer's save_model: the
            # same model, saved by accelerate for its own resume; not a second set of HF weights)
            if any(not p.name.startswith("pytorch_model_fsdp") for p in _bin_files(self.path)):
                index.warnings.append("pytorch_model*.bin files are present too; showing the safetensors weights")
        elif _fsdp_local_shards(self.path) and not _bin_files(self.path):
            raise CkptError(f"an accelerate FSDP LOCAL_STATE_DICT save ({_fsdp_local_shards(self.path)[0].name} ...: "
                            f"each rank's flattened parameters, no named weights), which ckptscope does not read; "
                            f"save with fsdp_state_dict_type SHARDED_STATE_DICT or FULL_STATE_DICT", self.path)
        else:
            index.metadata["weights"] = "pytorch_model.bin"
            bin_index = _pick_index(self.path, BIN_INDEX, "pytorch_model.bin.index*.json")
            bins = _bin_files(self.path)
            if bin_index is None:
                bins, more = _accelerate_models(bins, "pytorch_model.bin")
                self._note_more_models(index, "pytorch_model.bin", more)
            self._index_bins(index, bin_index, bins)
        self._add_side_files(index)
        config = index.saved_config
        mark_config_tie(index, config)
        quantised = unhandled_quantization(config, ())  # by config only: no per-name pass on 100k-tensor indexes
        if quantised:
            index.warnings.append(f"{quantised}: tensors are listed and compared as stored (packed words, codes "
                                  f"and scales), not dequantised; parameter counts count stored elements")
        return index

    def _note_more_models(self, index: CheckpointIndex, first: str, more: list[Path]) -> None:
        """An accelerate ``save_state`` of several models shows its first; the others are named (each
        opens as its own file), and exports refuse the dir (``accelerate_models``)."""
        if not more:
            return
        names = [first] + [p.name for p in more]
        index.metadata["accelerate_models"] = names
        index.warnings.append(f"accelerate save_state of {len(names)} models: showing the first ({first}); open "
                              f"{', '.join(p.name for p in more)} by file for the other{'s' if len(more) > 1 else ''}")

    # --- weights ---------------------------------------------------------------------------

    def _index_safetensors(self, index: CheckpointIndex, index_file: Path | None, files: list[Path]) -> None:
        if index_file is not None:
            weight_map, meta = _read_weight_map(index_file)
            index.metadata["index"] = meta
            shards = self._shards_named_by(index, index_file, weight_map)
            headers = {shard: self._header(index, shard) for shard in shards}
            owner: dict[str, str] | None = None  # tensor -> shard that stores it; built only for a misplaced one
            found_in: dict[str, int] = dict.fromkeys(headers, 0)  # shard -> tensors the index places there, found
            tensors = index.tensors
            for name, shard in weight_map.items():
                header = headers.get(shard)
                if header is None:
                    continue  # a missing shard: already an issue
                found = header.tensors.get(name)
                if found is None:
                    if owner is None:
                        owner = {n: s for s, h in headers.items() for n in h.tensors}
                    self._misplaced(index, index_file, name, shard, owner.get(name))
                    if name in owner:
                        tensors[name] = headers[owner[name]].tensors[name]
                    continue
                found_in[shard] += 1
                tensors[name] = found
            for shard, header in headers.items():
                # When the index places every tensor of the shard there, none can be missing from it.
                complete = len(header.tensors) == found_in[shard]
                extra = [] if complete else [n for n in header.tensors if n not in weight_map]
                if extra:
                    index.add_issue("index-mismatch", f"{len(extra)} tensors stored here are not listed in "
                                    f"{index_file.name} (loaders skip them)", file=shard, tensors=tuple(extra),
                                    warning=f"{shard}: {len(extra)} tensors not listed in {index_file.name}")
                    for name in extra:
                        index.tensors.setdefault(name, header.tensors[name])
                note_header(index, header, shard)
            unindexed = [p.name for p in files if p.name not in headers]
            if unindexed:
                index.warnings.append(f"not named by {index_file.name}, ignored: {', '.join(unindexed)}")
            self._check_total_size(index, meta, index_file)
            return
        _missing_numbered_shards(index, [p.name for p in files])
        owners: dict[str, str] = {}
        for path in files:
            shard = path.name  # once per file: Path.name per tensor was 2 % of a 100k-tensor inspect
            header = self._header(index, shard)
            note_header(index, header, shard)
            if header.metadata:
                index.metadata.setdefault("__metadata__", header.metadata)
            for name, meta in header.tensors.items():
                if name in owners:
                    raise CkptError(f"tensor {name!r} is stored in both {owners[name]} and {shard}", self.path)
                owners[name] = shard
                index.tensors[name] = meta

    def _index_bins(self, index: CheckpointIndex, index_file: Path | None, files: list[Path]) -> None:
        if index_file is not None:
            weight_map, index_meta = _read_weight_map(index_file)
            index.metadata["index"] = index_meta
            shards = self._shards_named_by(index, index_file, weight_map)
        else:
            weight_map, index_meta, shards = {}, {}, [p.name for p in files]
        for shard in shards:
            part = CheckpointIndex(path=str(self.path / shard), format="torch")
            shard_path = self.path / shard
            if self.trust_pickle:
                trusted = TrustedTorchFile(shard_path, mmap=is_torch_zip(shard_path))
                trusted.fill_index(part, shard)
                self._trusted_shards[shard] = trusted
            elif is_torch_zip(shard_path):
                parsed = read_torch_zip(shard_path)
                build_torch_index(part, parsed.obj, shard, parsed.storages, big_endian=parsed.big_endian, path=shard_path)
            elif TorchLegacyReader.supports(shard_path):
                obj, placements, big_endian = read_legacy(shard_path)
                build_torch_index(part, obj, shard, placements, big_endian=big_endian, path=shard_path)
            else:
                raise CkptError("not a torch.save file", shard_path)
            for name, meta in part.tensors.items():
                if name in index.tensors:
                    raise CkptError(f"tensor {name!r} is stored in two shards", shard_path)
                index.tensors[name] = meta
            index.objects.extend(ObjectEntry(f"{shard}:{o.name}", o.type, o.value) for o in part.objects)
            index.warnings.extend(w for w in part.warnings if w not in index.warnings)
        for name, shard in weight_map.items():
            found = index.tensors.get(name)
            if shard in shards and (found is None or found.files != (shard,)):
                self._misplaced(index, index_file, name, shard, found.files[0] if found and found.files else None)
        if index_file is not None:
            self._check_total_size(index, index_meta, index_file)

    def _read_chunk(self, meta: TensorMeta, chunk: Any, local: tuple[tuple[int, int], ...]) -> Any:
        trusted = self._trusted_shards.get(chunk.file)
        if trusted is not None:
            return trusted.read(meta.name, local)
        return super()._read_chunk(meta, chunk, local)

    def _shards_named_by(self, index: CheckpointIndex, index_file: Path, weight_map: dict[str, str]) -> list[str]:
        """The shards the index names that exist; each missing one is an issue listing its tensors."""
        shards = sorted(set(weight_map.values()), key=natural_key)
        present = []
        for shard in shards:
            if "/" in shard or "\\" in shard or shard in ("", ".", ".."):
                raise CkptError(f"index names shard {shard!r} outside the checkpoint directory", index_file)
            if (self.path / shard).is_file():
                present.append(shard)
                continue
            names = tuple(n for n, s in weight_map.items() if s == shard)
            index.add_issue("missing-file", f"not found; {index_file.name} places {len(names)} tensors in it",
                            file=shard, tensors=names,
                            warning=f"{index_file.name} names shard {shard}, which is missing "
                                    f"({len(names)} tensors cannot be shown)")
        return present

    def _header(self, index: CheckpointIndex, shard: str) -> SafetensorsHeader:
        """One shard's header; a shard cut short after its header is an issue, not a failure."""
        header = parse_safetensors_header(self.path / shard, shard, allow_truncated=True)
        if header.truncated:
            end = max(c.byte_offset + c.byte_length for n in header.truncated for c in header.tensors[n].chunks)
            index.issues.append(Issue("truncated", f"the header places data up to byte {end}, the "
                                      f"file has {header.file_size}", shard, header.truncated))
        return header

    @staticmethod
    def _misplaced(index: CheckpointIndex, index_file: Path, name: str, shard: str, actual: str | None) -> None:
        where = f"it is stored in {actual}" if actual else "no shard the index names holds it"
        index.add_issue("index-mismatch", f"{index_file.name} places it in {shard}, which does not contain it; {where}",
                        file=shard, tensors=(name,),
                        warning=f"{index_file.name} places tensor {name!r} in {shard}, which does not contain it "
                                f"({where})")

    @staticmethod
    def _check_total_size(index: CheckpointIndex, meta: dict[str, Any], index_file: Path) -> None:
        declared = meta.get("total_size")
        # index.total_bytes counts a tied weight once: it is one storage in a .bin shard, saved (and
        # counted by the writer) once.
        if isinstance(declared, int) and declared != index.total_bytes:
            index.warnings.append(
                f"{index_file.name}: total_size says {declared} bytes, the tensors add up to {index.total_bytes}"
            )

    # --- everything else in the directory ----------------------------------------------------

    def _add_side_files(self, index: CheckpointIndex) -> None:
        add_side_files(index, self.path)
