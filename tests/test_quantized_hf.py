"""Quantised HF checkpoints ckptscope cannot dequantise (formats/hf/quantization.py).

Each fixture is a tiny transformers Llama whose linear weights are replaced by the tensors the
quantiser's ``save_pretrained`` writes, under its names, dtypes and shapes, with its
``quantization_config`` (layouts read from gptqmodel, bitsandbytes 0.50 and compressed-tensors 0.20
saves; the values need not be a faithful quantisation, the layout is what is under test):

* GPTQ: ``qweight`` int32 [K/8, N], ``qzeros`` int32 [K/G, N/8], ``scales`` fp16 [K/G, N], ``g_idx`` int32 [K];
* bitsandbytes 8-bit: ``weight`` int8 [N, K], ``SCB`` float32 [N], ``weight_format`` uint8 [];
* compressed-tensors FP8: ``weight`` float8_e4m3fn [N, K], ``weight_scale`` / ``input_scale`` bf16 [1];
* compressed-tensors W4A16: ``weight_packed`` int32 [N, K/8], ``weight_scale`` bf16 [N, K/G], ``weight_shape`` int64 [2].

Before, ``convert/merge --dtype bfloat16`` cast packed words and FP8 codes into "weights" and kept the
``quantization_config`` (exit 0); an 8-bit ``weight`` looked like any other. Now every export is refused
with one line, nothing is written, and ``inspect`` says the tensors are listed as stored.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_cli

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
G = 32


def _base(path):
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, json.loads((path / "config.json").read_text())


def _linear(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in LINEARS


def _gptq(w):
    n, k = w.shape
    return {"qweight": torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32),
            "qzeros": torch.randint(-2**31, 2**31 - 1, (k // G, n // 8), dtype=torch.int32),
            "scales": (w.abs().amax() / 7 * torch.ones(k // G, n)).half(),
            "g_idx": torch.arange(k, dtype=torch.int32) // G}


def _bnb8(w):
    scb = w.abs().amax(1).float()
    return {"weight": torch.round(w / scb[:, None] * 127).to(torch.int8), "SCB": scb,
            "weight_format": torch.tensor(0, dtype=torch.uint8)}


def _ct_fp8(w):
    scale = (w.abs().amax() / 448).reshape(1)
    return {"weight": (w / scale).to(torch.float8_e4m3fn), "weight_scale": scale.bfloat16(),
            "input_scale": torch.ones(1, dtype=torch.bfloat16)}


def _ct_w4a16(w):
    n, k = w.shape
    return {"weight_packed": torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32),
            "weight_scale": (w.abs().amax(1, keepdim=True) / 7).expand(n, k // G).bfloat16().contiguous(),
            "weight_shape": torch.tensor([n, k], dtype=torch.int64)}


SCHEMES = {
    "gptq": (_gptq, {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": False, "sym": False,
                     "checkpoint_format": "gptq"}),
    "bitsandbytes": (_bnb8, {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False,
                             "llm_int8_threshold": 6.0}),
    "compressed-tensors fp8": (_ct_fp8, {"quant_method": "compressed-tensors", "format": "float-quantized",
                                         "quantization_status": "compressed"}),
    "compressed-tensors w4a16": (_ct_w4a16, {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                             "quantization_status": "compressed"}),
}


def _quantised(tmp_path, scheme: str, *, with_config: bool = True):
    from safetensors.torch import save_file

    base = tmp_path / "base"
    state, config = _base(base)
    make, quant = SCHEMES[scheme]
    tensors = {}
    for name, value in state.items():
        if _linear(name):
            prefix = name.removesuffix(".weight")
            tensors.update({f"{prefix}.{k}": v for k, v in make(value.float()).items()})
        elif name != "lm_head.weight" or not config.get("tie_word_embeddings"):
            tensors[name] = value
    out = tmp_path / scheme.replace(" ", "_")
    out.mkdir()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    if with_config:
        (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    return base, out


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_exports_of_quantised_checkpoints_are_refused(tmp_path, scheme):
    _, src = _quantised(tmp_path, scheme)
    method = SCHEMES[scheme][1]["quant_method"]
    for command in (["convert", str(src), str(tmp_path / "out"), "--to", "hf", "--dtype", "bfloat16"],
                    ["convert", str(src), str(tmp_path / "out"), "--to", "hf"],
                    ["convert", str(src), str(tmp_path / "out"), "--to", "mcore", "--skip-unknown"],
                    ["merge", str(src), str(tmp_path / "out"), "--dtype", "float32"]):
        result = run_cli(*command)
        assert result.code == 2, (command, result.err)
        assert f"quant_method {method!r}" in result.err and "cannot dequantise" in result.err, result.err
        assert result.err.count("\n") == 1 and "Traceback" not in result.err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_inspect_says_the_tensors_are_as_stored(tmp_path, scheme):
    _, src = _quantised(tmp_path, scheme)
    result = run_cli("inspect", "--json", str(src))
    assert result.code == 0, result.err
    warnings = json.loads(result.out)["metadata"]["warnings"]
    assert any("quantised" in w and "as stored" in w for w in warnings), warnings


@pytest.mark.parametrize("scheme", ["gptq", "compressed-tensors w4a16"])
def test_packed_tensors_are_refused_without_a_config(tmp_path, scheme):
    """A bare safetensors file of a quantised model has no quantization_config: its tensor names say it."""
    _, src = _quantised(tmp_path, scheme, with_config=False)
    base = tmp_path / "base"
    result = run_cli("convert", str(src / "model.safetensors"), str(tmp_path / "out"), "--to", "hf",
                     "--hf-config", str(base), "--dtype", "bfloat16")
    assert result.code == 2 and "quantisation tensor" in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_a_plain_model_with_a_quantised_hf_config_is_refused(tmp_path):
    """--hf-config names the config the export writes: one that says the weights are quantised would
    make transformers read plain weights as packed ones."""
    base, src = _quantised(tmp_path, "gptq")
    result = run_cli("convert", str(base), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(src))
    assert result.code == 2 and "quant_method 'gptq'" in result.err, result.err
    result = run_cli("convert", str(base), str(tmp_path / "out"), "--to", "hf")  # its own config: fine
    assert result.code == 0, result.err


def _fp8_static_blocks(tmp_path):
    """transformers' fine-grained FP8 with static activations, as its FP8 save writes it (DeepSeek-V3's
    block layout): ``weight`` float8_e4m3fn, ``weight_scale_inv`` float32 [ceil(N/128), ceil(K/128)],
    ``activation_scale`` float32 []."""
    from safetensors.torch import save_file

    base = tmp_path / "base"
    state, config = _base(base)
    tensors = {}
    for name, value in state.items():
        if not _linear(name):
            tensors[name] = value
            continue
        w = value.float()
        scale = (w.abs().amax() / 448).reshape(1, 1)  # one 128x128 block covers these small matrices
        tensors[name] = (w / scale).to(torch.float8_e4m3fn)
        tensors[name + "_scale_inv"] = scale
        tensors[name.removesuffix("weight") + "activation_scale"] = torch.tensor(0.05)
    out = tmp_path / "fp8_static"
    out.mkdir()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    quant = {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128], "fmt": "e4m3"}
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    return out


def test_fp8_blocks_dequantised_leave_the_activation_scales_out(tmp_path):
    """Dequantised, the model is plain: its config loses quantization_config, so the static activation
    scales would be unexpected keys to transformers (before: written as bf16 tensors)."""
    import transformers

    src = _fp8_static_blocks(tmp_path)
    out = tmp_path / "out"
    result = run_cli("convert", str(src), str(out), "--to", "hf", "--dtype", "bfloat16")
    assert result.code == 0, result.err
    _, info = transformers.AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_rename_keeps_each_fp8_weight_with_its_scales(tmp_path):
    """A rule on a block-scaled weight carries its scales along (the TUI renames the one logical tensor
    it shows; before, the scale stayed behind and the weight read as its raw FP8 codes); a rule that
    parts them itself (the scale alone dropped or renamed elsewhere) is refused."""
    from safetensors import safe_open

    src = _fp8_static_blocks(tmp_path)

    def names(out):
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            return set(f.keys())

    carried = run_cli("rename", str(src), str(tmp_path / "a"), "--sub", r"\.weight$", ".w")
    assert carried.code == 0, carried.err
    assert {"model.layers.0.self_attn.q_proj.w", "model.layers.0.self_attn.q_proj.w_scale_inv"} <= names(tmp_path / "a")
    assert not any(n.endswith(".weight_scale_inv") for n in names(tmp_path / "a"))
    one = run_cli("rename", str(src), str(tmp_path / "b"), "--sub", r"^model\.layers\.0\.mlp\.down_proj\.weight$",
                  "model.layers.0.mlp.down2.weight")  # what the TUI's rename of that tensor asks
    assert one.code == 0, one.err
    assert {"model.layers.0.mlp.down2.weight", "model.layers.0.mlp.down2.weight_scale_inv"} <= names(tmp_path / "b")
    result = run_cli("inspect", "--json", str(tmp_path / "b"))
    down2 = next(t for t in json.loads(result.out)["tensors"] if t["name"] == "model.layers.0.mlp.down2.weight")
    assert down2["dtype"] == "float32" and down2["quantization"]["scheme"] == "fp8_block"  # still read dequantised
    dropped = run_cli("rename", str(src), str(tmp_path / "c"), "--drop", r"q_proj\.weight$")
    assert dropped.code == 0, dropped.err
    assert not any(n.endswith(("q_proj.weight", "q_proj.weight_scale_inv")) for n in names(tmp_path / "c"))
    orphan = run_cli("rename", str(src), str(tmp_path / "d"), "--drop", r"q_proj\.weight_scale_inv$")
    assert orphan.code == 2 and "rename or drop them together" in orphan.err and not (tmp_path / "d").exists()
    elsewhere = run_cli("rename", str(src), str(tmp_path / "e"), "--sub", r"q_proj\.weight_scale_inv$", "q_proj.s")
    assert elsewhere.code == 2 and "holds the block scales of" in elsewhere.err, elsewhere.err
