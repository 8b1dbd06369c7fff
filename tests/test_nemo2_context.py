"""A NeMo 2.0 checkpoint's model config is its ``context/model.yaml`` (NeMo keeps no Megatron args).

The checkpoint is laid out as NeMo writes one (``nemo/lightning/io/mixin.py``, ``IOMixin.io_dump``:
``context/io.json`` and, through nemo_run's YAML serialiser, ``context/model.yaml`` with the model's
``GPTConfig`` field by field, defaults included, functions and dtypes as ``{_target_, _call_}`` mappings;
``weights/`` a megatron-core ``dist_checkpointing`` save whose ``common.pt`` holds Lightning's bookkeeping,
no ``args``). NeMo does not run here, so the weights are megatron-core's own save of ``hf_llama_gqa``
(``mcore_llama_gqa``, proven equal to the HF model by logits when it was made) with Megatron-LM's
``args`` taken out of ``common.pt``, and model.yaml states that model as NeMo's ``LlamaConfig`` would.
Before: ``convert`` said "pass --hf-config"; the judge of the export is transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ckptscope.core.roles import training_kind
from tests.conftest import REPO, run_cli

HF = REPO / "sample_ckpts" / "hf_llama_gqa"
MCORE = REPO / "sample_ckpts" / "mcore_llama_gqa" / "iter_0000000"

MODEL_YAML = """\
_target_: nemo.collections.llm.gpt.model.llama.LlamaModel
config:
  _target_: nemo.collections.llm.gpt.model.llama.LlamaConfig
  account_for_embedding_in_pipeline_split: false
  activation_func:
    _call_: false
    _target_: torch.nn.functional.silu
  add_bias_linear: false
  add_qkv_bias: false
  attention_dropout: 0.0
  bf16: false
  bias_activation_fusion: true
  ffn_hidden_size: 96
  fp16: false
  gated_linear_unit: true
  hidden_dropout: 0.0
  hidden_size: 64
  init_method_std: 0.02
  kv_channels: 8
  layernorm_epsilon: 1.0e-06
  make_vocab_size_divisible_by: 128
  normalization: RMSNorm
  num_attention_heads: 8
  num_layers: 2
  num_query_groups: 2
  params_dtype:
    _call_: false
    _target_: torch.float32
  persist_layer_norm: true
  position_embedding_type: rope
  rotary_base: {rotary_base}
  rotary_percent: 1.0
  seq_length: 64
  share_embeddings_and_output_weights: false
  tensor_model_parallel_size: 1
  vocab_size: null
model_transform: null
optim:
  _target_: nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule
  config:
    _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig
    lr: 0.0003
    optimizer: adam
tokenizer:
  _target_: nemo.collections.common.tokenizers.huggingface.auto_tokenizer.AutoTokenizer
  pretrained_model_name: meta-llama/Meta-Llama-3-8B
  use_fast: true
"""


def _nemo(tmp_path: Path, *, rotary_base: int = 10000, model_yaml: str | None = None) -> Path:
    target = tmp_path / "checkpoints" / "llama--reduced_train_loss=5.09-epoch=0-step=9-consumed_samples=72.0"
    shutil.copytree(MCORE, target / "weights")
    common = target / "weights" / "common.pt"
    torch.save({"epoch": 0, "global_step": 9, "pytorch-lightning_version": "2.5.0"}, common)
    (target / "context").mkdir()
    (target / "context" / "io.json").write_text("{}")
    (target / "context" / "model.yaml").write_text(
        model_yaml if model_yaml is not None else MODEL_YAML.format(rotary_base=rotary_base))
    return target


def test_the_model_config_is_read_and_listed_as_args(tmp_path):
    ckpt = _nemo(tmp_path)
    result = run_cli("inspect", "--json", str(ckpt))
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert {"name": "nemo_model", "type": "dict"} in report["objects"]
    assert training_kind("nemo_model") == "args"  # the TUI's tree files it with the run's args


def test_convert_to_hf_needs_no_hf_config_and_transformers_computes_the_same_model(tmp_path):
    from transformers import AutoModelForCausalLM

    ckpt = _nemo(tmp_path)
    out = tmp_path / "hf"
    result = run_cli("convert", str(ckpt), str(out), "--to", "hf")
    assert result.code == 0, result.err
    # NeMo's model.yaml leaves vocab_size null: the padded rows are kept, and said
    assert "the true vocabulary size is unknown" in result.err and "all 256 rows kept" in result.err
    ours, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    reference = AutoModelForCausalLM.from_pretrained(HF)
    tokens = torch.arange(0, 250).reshape(5, 50) % 250
    with torch.no_grad():
        a, b = ours(tokens).logits[..., :250], reference(tokens).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    # with the HF config beside it, the vocabulary is cut to the real one: the HF model itself
    exact = tmp_path / "exact"
    assert run_cli("convert", str(ckpt), str(exact), "--to", "hf", "--hf-config", str(HF)).code == 0
    assert run_cli("diff", str(HF), str(exact)).code == 0


def test_diff_against_the_hf_model_reads_the_config_too(tmp_path):
    same = _nemo(tmp_path / "a")
    assert run_cli("diff", str(HF), str(same)).code == 0
    other = _nemo(tmp_path / "b", rotary_base=500000)
    result = run_cli("diff", "--json", str(HF), str(other))
    assert result.code == 1, result.err
    facts = {t["name"]: (t["a"], t["b"]) for t in json.loads(result.out)["tensors"] if t["name"].startswith("Megatron")}
    assert facts == {"Megatron args: rotary_base": ("10000.0", "500000")}


@pytest.mark.parametrize("text", ["config: [unclosed", "!!python/object/apply:os.system ['true']\n", "[1, 2]\n"])
def test_a_model_yaml_that_cannot_be_read_is_said_and_asks_for_hf_config(tmp_path, text):
    ckpt = _nemo(tmp_path, model_yaml=text)
    shown = run_cli("inspect", str(ckpt))
    assert shown.code == 0 and "context/model.yaml (beside weights/)" in shown.out + shown.err, shown.out
    result = run_cli("convert", str(ckpt), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "--hf-config" in result.err and "Traceback" not in result.err, result.err
