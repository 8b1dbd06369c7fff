"""Sequence / token classification models (reward models; verl's critic is a ``*ForTokenClassification``
with ``num_labels=1``): their ``score`` head is part of the model. It was an unknown entry: ``convert``
refused the model, and with ``--skip-unknown`` wrote a config transformers then filled with a random head.
Written by transformers' own ``save_pretrained``; judged by ``from_pretrained(output_loading_info=True)``."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["LlamaForSequenceClassification", "Qwen2ForTokenClassification"])
def head_model(request, tmp_path_factory):
    torch.manual_seed(3)
    family = request.param.split("For")[0]
    config = getattr(transformers, f"{family}Config")(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=96, num_labels=1, pad_token_id=0)
    model = getattr(transformers, request.param)(config).eval()
    out = tmp_path_factory.mktemp("heads") / request.param
    model.save_pretrained(out)
    return request.param, model, out


def test_the_head_is_model_weight_and_exports_whole(head_model, cli, tmp_path):
    name, model, saved = head_model
    inspected = cli("inspect", "--json", str(saved))
    assert inspected.code == 0, inspected.err
    metadata = json.loads(inspected.out)["metadata"]
    assert metadata["num_params"] == sum(p.numel() for p in model.parameters())
    assert not metadata["roles"].get("unknown"), metadata["roles"]
    out = tmp_path / "hf"
    result = cli("convert", str(saved), "--to", "hf", "--dtype", "float32", str(out))
    assert result.code == 0, result.err
    loaded, info = getattr(transformers, name).from_pretrained(str(out), output_loading_info=True)
    assert not any(info.values()), info
    ids = torch.tensor([[5, 7, 9, 11]])
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)


def test_to_megatron_says_what_the_head_is(head_model, cli, tmp_path):
    _, _, saved = head_model
    result = cli("convert", str(saved), "--to", "mcore", str(tmp_path / "mc"))
    assert result.code == 2 and "score.weight is the head of a sequence/token classification model" in result.err
    assert result.err.count("\n") == 1 and not (tmp_path / "mc").exists()


def test_a_custom_models_own_score_does_not_make_it_transformers(cli, tmp_path):
    """``score`` belongs to an HF model's names, but it must not vote for them: a custom model of ``proj``
    and ``score`` (half its names) was taken for transformers' naming and ``proj`` left out as unknown
    (a reviewer)."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {"proj.weight": np.ones((8, 16), np.float32), "proj.bias": np.ones(8, np.float32),
               "score.weight": np.ones((1, 16), np.float32), "score.bias": np.ones(1, np.float32)}
    save_file(tensors, str(tmp_path / "custom.safetensors"))
    result = cli("inspect", "--json", str(tmp_path / "custom.safetensors"))
    assert result.code == 0, result.err
    metadata = json.loads(result.out)["metadata"]
    assert metadata["num_params"] == sum(v.size for v in tensors.values())
    assert not metadata["roles"].get("unknown"), metadata["roles"]
