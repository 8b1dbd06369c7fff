#!/usr/bin/env python
"""Write NeMo 1.x ``.nemo`` archives of a Megatron-Core GPT (the ``hf_llama_gqa`` sample's weights).

    python sample_ckpts/make_nemo_samples.py OUT_DIR

Not shipped: tests write these into temporary dirs. NeMo itself does not install here (its import
chain needs packages this machine's index lacks), so the archives are laid out from its source
(``nemo/core/connectors/save_restore_connector.py``, ``SaveRestoreConnector.save_to``): a folder holding
``model_config.yaml`` (``model.to_config_file``: OmegaConf's YAML of the model config), the artifacts
under ``<uuid4 hex>_<name>`` and ``model_weights.ckpt`` (``torch.save(model.state_dict())``), made into
the archive by ``_make_nemo_file_from_folder``: ``tarfile.open(path, "w:")`` then
``tar.add(folder, arcname=".")``. The state dict is a real megatron-core ``GPTModel``'s (local spec,
TP=1) with ``hf_llama_gqa``'s weights loaded into it, under ``model.``: NeMo's ``MegatronGPTModel`` keeps
the Megatron-Core model as ``self.model``.

* ``llama.nemo``: as above (NeMo 1.7 and later).
* ``llama_gz.nemo``: the same folder as ``"w:gz"`` (NeMo before 1.7).
* ``llama_tp2.nemo``: ``mp_rank_00/`` and ``mp_rank_01/model_weights.ckpt`` (``NLPSaveRestoreConnector``
  under tensor parallelism; each rank's file here is the whole model, only the layout matters).
* ``llama_dist.nemo``: ``model_weights/`` holding a Megatron-Core torch_dist checkpoint (the
  ``mcore_llama_gqa`` sample's files) instead of ``model_weights.ckpt``.
"""

from __future__ import annotations

import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent
sys.path.insert(0, str(SAMPLES))

TOKENIZER_ARTIFACT = "2b6d5e0f8c1a4f3e9d7b6a5c4d3e2f10_tokenizer.json"
"""An artifact as ``_handle_artifacts`` names it: ``uuid.uuid4().hex`` + ``_`` + the file's name."""


def gpt_state_dict() -> tuple[dict, object]:
    """``hf_llama_gqa`` loaded into a megatron-core GPTModel: its ``state_dict()`` under ``model.``, and its args."""
    import make_mcore_pair_samples as mp

    hf = mp.load_hf_model(SAMPLES / "hf_llama_gqa")
    args = mp.megatron_args(hf.config)
    mp.ensure_single_rank_world()
    with mp.cpu_megatron():
        model = mp.build_gpt_model(args)
        mp.load_params(model, mp.hf_to_mcore(hf.state_dict(), args))
        state = model.state_dict()
    return {f"model.{key}": value for key, value in state.items()}, args


def model_config(args) -> dict:
    """The keys of NeMo 1.x's ``megatron_gpt_config.yaml`` that describe this model."""
    return {
        "mcore_gpt": True, "num_layers": args.num_layers, "hidden_size": args.hidden_size,
        "ffn_hidden_size": args.ffn_hidden_size, "num_attention_heads": args.num_attention_heads,
        "num_query_groups": args.num_query_groups, "kv_channels": args.kv_channels,
        "max_position_embeddings": args.max_position_embeddings, "encoder_seq_length": args.max_position_embeddings,
        "normalization": "rmsnorm", "layernorm_epsilon": args.norm_epsilon, "activation": "fast-swiglu",
        "bias": False, "position_embedding_type": "rope", "rotary_base": args.rotary_base,
        "share_embeddings_and_output_weights": not args.untie_embeddings_and_output_weights,
        "make_vocab_size_divisible_by": args.make_vocab_size_divisible_by, "precision": 32,
        "tokenizer": {"library": "huggingface", "type": "meta-llama/Llama-2-7b-hf",
                      "vocab_file": f"nemo:{TOKENIZER_ARTIFACT}"},
        "target": "nemo.collections.nlp.models.language_modeling.megatron_gpt_model.MegatronGPTModel",
        "nemo_version": "1.23.0",
    }


def _folder(root: Path, args, weights: dict[str, dict] | None, dist_dir: Path | None = None) -> Path:
    import torch
    import yaml

    root.mkdir(parents=True)
    (root / "model_config.yaml").write_text(yaml.safe_dump(model_config(args), sort_keys=False), encoding="utf-8")
    (root / TOKENIZER_ARTIFACT).write_text('{"model": {"type": "BPE"}}', encoding="utf-8")
    for rel, state in (weights or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, root / rel)
    if dist_dir is not None:
        shutil.copytree(dist_dir, root / "model_weights")
    return root


def _archive(folder: Path, target: Path, mode: str = "w:") -> Path:
    """``SaveRestoreConnector._make_nemo_file_from_folder``."""
    with tarfile.open(target, mode) as tar:
        tar.add(folder, arcname=".")
    return target


def write_nemo_samples(out: Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state, args = gpt_state_dict()
    written = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one = _folder(tmp / "one", args, {"model_weights.ckpt": state})
        written["llama"] = _archive(one, out / "llama.nemo")
        written["llama_gz"] = _archive(one, out / "llama_gz.nemo", "w:gz")
        ranks = _folder(tmp / "tp2", args, {f"mp_rank_{r:02d}/model_weights.ckpt": state for r in (0, 1)})
        written["llama_tp2"] = _archive(ranks, out / "llama_tp2.nemo")
        dist = _folder(tmp / "dist", args, None, SAMPLES / "mcore_llama_gqa" / "iter_0000000")
        written["llama_dist"] = _archive(dist, out / "llama_dist.nemo")
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name, path in write_nemo_samples(Path(argv[0])).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
