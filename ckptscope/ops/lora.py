"""LoRA adapters: the effective rank of each A/B pair, and merging an adapter into its base model.

``lora_stats`` takes the SVD of ``B @ A`` in float64 (numpy) for every pair and reports its
singular values and numerical rank. The default tolerance is numpy's ``matrix_rank`` rule,
``s_max * max(out, in) * eps(float64)``; ``rtol`` replaces it by ``rtol * s_max``. Pairs whose
product is large (more than ``FULL_SVD_MAX_ELEMS`` elements) go through QR of ``B`` and ``A^T``
instead: ``B A = Qb (Rb Ra^T) Qa^T`` has the singular values of the ``r x r`` core, the same values
up to rounding, at a fraction of the cost.

``merge_lora`` writes the base HF model with ``W + scaling * (B @ A)`` applied to every adapted
module (transposed into a transformers ``Conv1D``, whose weight is [in, out]: PEFT decides that per
module by its type, not by the config's ``fan_in_fan_out``), exactly as PEFT's ``merge_and_unload()``:
the update is computed by torch with PEFT's own expression, ``transpose(B @ A, fan_in_fan_out) * scaling``, in
float32, and added in float32, so the result equals PEFT's bit for bit (tested in float32 and bfloat16). Saved biases
(``bias="all"``/``"lora_only"``) replace the base's; ``lora_bias`` adds ``lora_B.bias * scaling``.
Tensors are streamed one by one into safetensors shards named like the base's (unchanged tensors are
copied file to file), in a temporary dir renamed into place. Features this merge does not implement
(DoRA, embedding or conv LoRA, trainable tokens, a resized vocabulary) are refused before anything is
written. Whole weights saved with the adapter (``modules_to_save`` copies, ``save_embedding_layers``'
embedding and head) replace the base's, in its dtype, before a pair is merged into them, as PEFT loads
them. Only the merge imports torch; listing and stats do not.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.core.units import plural
from ckptscope.formats import open_checkpoint
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.filecopy import copy_range
from ckptscope.core.roles import peft_base_name
from ckptscope.formats.safetensors.writer import new_file_header
from ckptscope.ops.atomic import atomic_output, check_destination

FULL_SVD_MAX_ELEMS = 1 << 22
"""Above this many elements in ``B @ A``, singular values come from the ``r x r`` QR core."""
SV_SHOWN = 8
"""Leading singular values listed per pair."""


def open_adapter(path: str | Path) -> tuple[CheckpointReader, dict[str, Any]]:
    """A reader on a PEFT LoRA adapter and its ``metadata["lora"]``; anything else is refused."""
    reader = open_checkpoint(path)
    index = reader.index()
    if index.format != "peft" or "lora" not in index.metadata:
        reader.close()
        raise CkptError(f"not a PEFT adapter dir (adapter_config.json + adapter_model.safetensors); "
                        f"it opens as {index.format}", path)
    lora = index.metadata["lora"]
    if lora.get("peft_type") not in (None, "LORA"):
        reader.close()
        raise CkptError(f"peft_type {lora['peft_type']} is not LoRA", path)
    return reader, lora


# --- stats -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairStats:
    module: str
    r: int
    lora_alpha: float
    scaling: float
    shape: tuple[int, int]
    """``B @ A``: ``(out_features, in_features)``."""
    rank: int
    """Numerical rank: singular values above ``tol``."""
    tol: float
    singular_values: tuple[float, ...]
    """Of ``B @ A`` (unscaled), largest first, at most ``r`` of them (the rest are zero)."""
    method: str
    """``svd`` (of the full product) or ``qr`` (of the ``r x r`` core)."""

    @property
    def s_max(self) -> float:
        return self.singular_values[0] if self.singular_values else 0.0

    @property
    def stable_rank(self) -> float:
        """``sum s^2 / s_max^2``: how many directions carry the update's energy."""
        return sum(s * s for s in self.singular_values) / self.s_max ** 2 if self.s_max else 0.0

    @property
    def delta_fro(self) -> float:
        """Frobenius norm of the applied update ``scaling * B @ A``."""
        return abs(self.scaling) * math.sqrt(sum(s * s for s in self.singular_values))

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "r": self.r, "lora_alpha": self.lora_alpha, "scaling": self.scaling,
                "shape": list(self.shape), "rank": self.rank, "tol": self.tol, "method": self.method,
                "s_max": self.s_max, "s_min": self.singular_values[-1] if self.singular_values else 0.0,
                "stable_rank": self.stable_rank, "delta_fro": self.delta_fro,
                "singular_values": list(self.singular_values)}


def pair_singular_values(b, a, *, full_svd_max_elems: int = FULL_SVD_MAX_ELEMS):
    """Singular values of ``B @ A`` (float64, largest first, ``min(out, in, r)`` of them) and the method."""
    import numpy as np

    b = np.asarray(b, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    if b.shape[0] * a.shape[1] <= full_svd_max_elems:
        s = np.linalg.svd(b @ a, compute_uv=False)
        return s[: min(b.shape[1], len(s))], "svd"
    _, rb = np.linalg.qr(b)
    _, ra = np.linalg.qr(a.T)
    return np.linalg.svd(rb @ ra.T, compute_uv=False), "qr"


def lora_stats(path: str | Path, *, rtol: float | None = None,
               full_svd_max_elems: int = FULL_SVD_MAX_ELEMS) -> tuple[dict[str, Any], list[PairStats]]:
    """The adapter's config essentials and the stats of every complete linear A/B pair."""
    import numpy as np

    reader, lora = open_adapter(path)
    if lora.get("config_errors"):
        reader.close()
        raise CkptError(f"adapter_config.json: {lora['config_errors'][0]}: no LoRA scale can be computed", path)
    out: list[PairStats] = []
    with reader:
        for pair in lora["pairs"]:
            if not pair.get("A") or not pair.get("B") or pair.get("layer") == "embedding" or "r" not in pair:
                continue
            a = reader.read(pair["A"])
            b = reader.read(pair["B"])
            if a.ndim != 2 or b.ndim != 2:
                continue
            s, method = pair_singular_values(b, a, full_svd_max_elems=full_svd_max_elems)
            shape = (int(b.shape[0]), int(a.shape[1]))
            s_max = float(s[0]) if len(s) else 0.0
            tol = rtol * s_max if rtol is not None else s_max * max(shape) * float(np.finfo(np.float64).eps)
            out.append(PairStats(module=pair["module"], r=int(pair["r"]), lora_alpha=pair["lora_alpha"],
                                 scaling=float(pair["scaling"]), shape=shape, rank=int((s > tol).sum()), tol=tol,
                                 singular_values=tuple(float(x) for x in s), method=method))
            reader.release_pages()
    summary = {k: lora[k] for k in ("r", "lora_alpha", "use_rslora", "fan_in_fan_out", "rank_pattern",
                                    "alpha_pattern", "target_modules", "warnings")}
    summary["tolerance"] = (f"rtol {rtol} x s_max" if rtol is not None
                            else "s_max x max(out, in) x eps(float64) (numpy matrix_rank)")
    return summary, out


# --- merge -------------------------------------------------------------------------------------

_MERGE_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(slots=True)
class MergeTensor:
    name: str
    dtype: str
    """Output dtype."""
    shape: tuple[int, ...]
    file: str
    """Output shard."""
    pair: dict[str, Any] | None = None
    """The LoRA pair merged into this weight."""
    lora_bias_of: dict[str, Any] | None = None
    """The pair whose ``lora_B.bias * scaling`` is added to this bias."""
    replace_with: str | None = None
    """Adapter tensor that replaces this one (a bias saved with ``bias="all"``/``"lora_only"``)."""
    transposed: bool = False
    """The weight is a transformers ``Conv1D`` ([in, out]): PEFT merges ``(B @ A).T`` into it."""

    @property
    def nbytes(self) -> int:
        return dtype_by_name(self.dtype).nbytes(math.prod(self.shape))


@dataclass(slots=True)
class MergePlan:
    adapter: Path
    base: Path
    out: Path
    dtype: str
    overwrite: bool
    tensors: list[MergeTensor] = field(default_factory=list)
    shards: list[tuple[str, list[str]]] = field(default_factory=list)
    copies: list[tuple[Path, str]] = field(default_factory=list)
    config: dict[str, Any] | None = None
    fan_in_fan_out: bool = False

    @property
    def merged(self) -> list[str]:
        return [t.name for t in self.tensors if t.pair or t.lora_bias_of or t.replace_with]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_json(self) -> dict[str, Any]:
        return {"adapter": str(self.adapter), "base": str(self.base), "out": str(self.out), "dtype": self.dtype,
                "tensors": len(self.tensors), "merged": self.merged, "bytes": self.total_bytes,
                "shards": [name for name, _ in self.shards]}


def _out_shard(name: str) -> str:
    if name.endswith(".safetensors"):
        return name
    if name.startswith("pytorch_model") and name.endswith(".bin"):
        return "model" + name.removeprefix("pytorch_model").removesuffix(".bin") + ".safetensors"
    return Path(name).stem + ".safetensors"


def plan_merge(adapter: str | Path, base: str | Path, out: str | Path, *, dtype: str = "keep",
               overwrite: bool = False) -> MergePlan:
    """Check everything and decide every output tensor; writes nothing. Refusals are ``CkptError``."""
    adapter, base, out = Path(adapter), Path(base), Path(out)
    if dtype not in ("keep", "float32"):
        raise CkptError(f"--dtype must be keep or float32, not {dtype}")
    reader, lora = open_adapter(adapter)
    with reader:
        adapter_tensors = dict(reader.index().tensors)
    if lora["unsupported_merge"]:
        raise CkptError("cannot merge: " + "; ".join(lora["unsupported_merge"]), adapter)
    zero = [pair["module"] for pair in lora["pairs"] if pair.get("scaling") == 0]
    if zero:
        # lora_alpha 0 makes every update zero: the "merged" model is the base, bit for bit, with exit 0. verl's
        # merger writes lora_alpha 0 when its lora_train_meta.json is absent (a probe with verl 0.9.1)
        raise CkptError(f"lora_alpha is 0 for {plural(len(zero), 'module')} (first: {zero[0]}): scaling = lora_alpha / r "
                        f"is 0, so the merge would write the base model unchanged; set the lora_alpha training used "
                        f"in adapter_config.json (verl records it in lora_train_meta.json beside its shards)", adapter)
    base_reader = open_checkpoint(base)
    with base_reader:
        index = base_reader.index()
    if index.format != "hf":
        raise CkptError(f"the base must be a Hugging Face model dir (save_pretrained); it opens as {index.format}",
                        base)
    if index.issues:
        raise CkptError(f"the base model is damaged: {index.warnings[0] if index.warnings else index.issues[0].detail}",
                        base)
    scaled = [n for n, t in index.tensors.items() if t.quantization]
    if scaled:  # the merged weights would be written as float32 next to a config that says FP8
        raise CkptError(f"the base model has {len(scaled)} block-scaled (FP8 / MXFP4) weights (first: {scaled[0]}); "
                        f"dequantise it first: ckptscope convert BASE DIR --to hf --dtype bfloat16", base)
    check_destination(base, out, overwrite=overwrite)
    check_destination(adapter, out, overwrite=overwrite)
    plan = MergePlan(adapter, base, out, dtype, overwrite, fan_in_fan_out=bool(lora["fan_in_fan_out"]))
    base_config = _read_config(base / "config.json") if (base / "config.json").is_file() else {}
    by_weight: dict[str, dict[str, Any]] = {}
    by_bias: dict[str, dict[str, Any]] = {}
    for pair in lora["pairs"]:
        by_weight[pair["module"] + ".weight"] = pair
        if pair.get("lora_bias"):
            by_bias[pair["module"] + ".bias"] = pair
    # bias="all"/"lora_only": the trained biases, ``M.base_layer.bias`` for an adapted module M; and whole
    # weights (modules_to_save copies, save_embedding_layers' embedding and head), which PEFT loads over the
    # base's before it merges a pair into them.
    replaced = {peft_base_name(n): n for n in [*lora["saved_biases"], *lora["other_tensors"]]}
    for target in [*by_weight, *by_bias, *replaced]:
        if target not in index.tensors:
            if target == "lm_head.weight" and base_config.get("tie_word_embeddings"):
                raise CkptError("the adapter changes lm_head, which this base ties to its input embedding "
                                "(tie_word_embeddings: no lm_head.weight is stored); merging it would change the "
                                "embedding too: not supported", adapter)
            raise CkptError(f"the adapter changes {target!r}, which the base model does not have "
                            f"(is this the adapter's base model?)", base)
    transposed: dict[str, bool] = {}
    for name, pair in by_weight.items():
        transposed[name] = _is_conv1d(base_config, name, tuple(index.tensors[name].shape), pair)
        want = (pair["out_features"], pair["in_features"])
        want = want[::-1] if transposed[name] else want
        if tuple(index.tensors[name].shape) != want:
            raise CkptError(f"{name}: base shape {list(index.tensors[name].shape)} does not fit the LoRA pair "
                            f"({pair['out_features']} x {pair['in_features']}"
                            f"{', a Conv1D: in x out' if transposed[name] else ''})", base)
    for name, source in replaced.items():
        saved, shape = adapter_tensors[source].shape, index.tensors[name].shape
        if saved != shape:
            resized = (len(saved) == len(shape) == 2 and saved[1] == shape[1]
                       and name.endswith(("embed_tokens.weight", "lm_head.weight", "wte.weight", "embed_in.weight")))
            raise CkptError(f"{name}: the adapter's saved copy has shape {list(saved)}, the base's {list(shape)}"
                            + (f" (the vocabulary was resized to {saved[0]} rows for training: PEFT needs the base "
                               f"resized first too; not supported)" if resized else ""), adapter)
    shards: dict[str, list[str]] = {}
    for name, meta in index.tensors.items():
        if len(meta.files) != 1:
            raise CkptError(f"{name}: stored in {len(meta.files)} files; only plain HF shards can be merged", base)
        touched = name in by_weight or name in by_bias or name in replaced
        if touched and meta.dtype not in _MERGE_DTYPES:
            raise CkptError(f"{name}: cannot merge into a {meta.dtype} weight (float32/16, bfloat16 only)", base)
        out_dtype = meta.dtype
        if dtype == "float32" and (meta.dtype.startswith(("float", "bfloat"))):
            out_dtype = "float32"
        shard = _out_shard(meta.files[0])
        shards.setdefault(shard, []).append(name)
        plan.tensors.append(MergeTensor(name, out_dtype, tuple(meta.shape), shard, pair=by_weight.get(name),
                                        lora_bias_of=by_bias.get(name), replace_with=replaced.get(name),
                                        transposed=transposed.get(name, False)))
    by_name = {t.name: t for t in plan.tensors}
    starts = {n: index.tensors[n].chunks[0].byte_offset for n in index.tensors}
    plan.shards = [(shard, sorted(names, key=lambda n: starts[n])) for shard, names in shards.items()]
    plan.tensors = [by_name[n] for _, names in plan.shards for n in names]
    for info in index.files:
        if info.role in ("config", "tokenizer") or info.path in ("generation_config.json", "chat_template.jinja"):
            if info.path != "config.json" and "/" not in info.path:
                plan.copies.append((base / info.path, info.path))
    plan.config = base_config or None
    return plan


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CkptError(f"cannot read config.json: {exc}", path) from None
    return config if isinstance(config, dict) else {}


CONV1D_ARCHS = frozenset({"gpt2", "openai-gpt", "decision_transformer", "imagegpt"})
"""transformers models whose attention and MLP projections are ``Conv1D`` (weight stored [in, out])."""
CONV1D_MODULES = frozenset({"c_attn", "q_attn", "c_proj", "c_fc"})


def _is_conv1d(config: dict[str, Any], weight: str, shape: tuple[int, ...], pair: dict[str, Any]) -> bool:
    """Whether PEFT merges into ``weight`` as a ``Conv1D``: it decides per module, by type (``Conv1D``:
    fan_in_fan_out on; ``nn.Linear``: off), whatever ``adapter_config.json`` says (that flag is only what
    the last module wrapped left in it). A non-square weight says it by its shape; a square one by
    the base's architecture and the module's name."""
    out, inp = pair["out_features"], pair["in_features"]
    if out != inp:
        return tuple(shape) == (inp, out)
    model_type = str(config.get("model_type") or "")
    return model_type in CONV1D_ARCHS and weight.removesuffix(".weight").rsplit(".", 1)[-1] in CONV1D_MODULES


_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64"}


def _as_torch(array, dtype_name: str):
    """A numpy array read by ckptscope as a float32 torch tensor (exact for every float dtype merged)."""
    import numpy as np
    import torch

    return torch.from_numpy(np.ascontiguousarray(array.astype(np.float32 if dtype_name != "float64" else np.float64)))


def _torch_to_bytes(tensor, dtype_name: str) -> bytes:
    import torch

    tensor = tensor.to(getattr(torch, _TORCH_DTYPES[dtype_name])).contiguous()
    if dtype_name == "bfloat16":
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes()


def _merged_bytes(t: MergeTensor, base: CheckpointReader, adapter: CheckpointReader, fan_in_fan_out: bool) -> bytes:
    """PEFT's merge of one tensor: ``W += transpose(B @ A, fan_in_fan_out) * scaling`` (float32)."""
    import torch

    stored = base.meta(t.name).dtype
    if t.replace_with is not None:  # PEFT loads the saved copy into the base's parameter: in the base's dtype
        saved = adapter.read(t.replace_with)
        weight = _as_torch(saved.astype(dtype_by_name(stored).numpy()), stored)
    else:
        weight = _as_torch(base.read(t.name), stored)
    if t.pair is not None:
        lora_a = _as_torch(adapter.read(t.pair["A"]), t.pair["dtype"])
        lora_b = _as_torch(adapter.read(t.pair["B"]), t.pair["dtype"])
        delta = lora_b @ lora_a
        if fan_in_fan_out:
            delta = delta.T
        delta = delta * t.pair["scaling"]
        if weight.is_floating_point() and not bool(torch.isfinite(delta.to(weight.dtype)).all()):
            # an lora_alpha of 1e300, or NaN in lora_A/B: the merged weight would be inf/NaN, written with exit 0
            raise CkptError(f"cannot merge {t.name}: the update scaling * (B @ A) is not finite in "
                            f"{t.dtype if t.dtype != 'keep' else stored} (scaling {t.pair['scaling']:g}, lora_alpha "
                            f"{t.pair['lora_alpha']!r}); the merged model would hold inf or NaN")
        weight = weight + delta.to(weight.dtype)
    if t.lora_bias_of is not None:
        name = t.lora_bias_of["lora_bias"]
        bias = _as_torch(adapter.read(name), adapter.meta(name).dtype)
        weight = weight + (bias * t.lora_bias_of["scaling"]).to(weight.dtype)
    with torch.no_grad():
        return _torch_to_bytes(weight, t.dtype)


def execute_merge(plan: MergePlan, progress: Callable[[str, int], None] | None = None) -> None:
    """Write ``plan.out`` (atomically: a temporary dir renamed into place)."""
    import torch  # noqa: F401 -- the update is torch's own arithmetic; without torch, fail before writing

    base = open_checkpoint(plan.base)
    adapter = open_checkpoint(plan.adapter)
    by_name = {t.name: t for t in plan.tensors}
    weight_map: dict[str, str] = {}
    with base, adapter, atomic_output(plan.out, directory=True, overwrite=plan.overwrite) as staging:
        for filename, names in plan.shards:
            tensors = [by_name[n] for n in names]
            with open(staging / filename, "wb") as handle:
                handle.write(new_file_header([(t.name, t.dtype, t.shape, t.nbytes) for t in tensors]))
                for t in tensors:
                    weight_map[t.name] = filename
                    if t.pair or t.lora_bias_of or t.replace_with:
                        data = _merged_bytes(t, base, adapter, t.transposed)
                        handle.write(data)
                    else:
                        stored = base.meta(t.name).dtype
                        span = base.byte_span(t.name) if stored == t.dtype else None
                        if span is not None:
                            copy_range(span[0], handle, span[1], span[2])
                        else:
                            array = base.read(t.name)
                            if stored != t.dtype:
                                array = array.astype(dtype_by_name(t.dtype).numpy())
                            handle.write(memoryview(array.reshape(-1).view("uint8")) if array.size else b"")
                            del array
                    base.release_pages()
                    if progress:
                        progress(t.name, t.nbytes)
                size = handle.tell()
            expected = len(new_file_header([(t.name, t.dtype, t.shape, t.nbytes) for t in tensors])) + sum(
                t.nbytes for t in tensors)
            if size != expected:
                raise CkptError(f"{filename}: wrote {size} bytes, expected {expected}")
        if len(plan.shards) > 1:
            index = {"metadata": {"total_size": plan.total_bytes}, "weight_map": weight_map}
            (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        if plan.config is not None:
            config = dict(plan.config)
            if plan.dtype == "float32":
                for key in ("torch_dtype", "dtype"):
                    if key in config:
                        config[key] = "float32"
                if "dtype" not in config and "torch_dtype" not in config:
                    config["dtype"] = "float32"
            (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for source, name in plan.copies:
            shutil.copy2(source, staging / name)
