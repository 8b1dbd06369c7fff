"""NeMo 1.x ``.nemo`` archives, read in place (``formats/nemo``).

The archives come from sample_ckpts/make_nemo_samples.py: a real megatron-core GPTModel holding the
``hf_llama_gqa`` sample's weights, its ``state_dict()`` saved by ``torch.save`` under NeMo's ``model.``
prefix, in the tar layout NeMo's ``SaveRestoreConnector`` writes. Judges: Python's ``tarfile`` + ``torch.load``
for the stored tensors, transformers ``from_pretrained(output_loading_info=True)`` for the export.
Before, every ``.nemo`` file was "unknown format".
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import run_cli
from dist_reference import SAMPLES, assert_no_torch_on_metadata_path

from ckptscope.ops.opening import open_checkpoint


@pytest.fixture(scope="module")
def nemo(tmp_path_factory) -> dict[str, Path]:
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    import make_nemo_samples

    return make_nemo_samples.write_nemo_samples(tmp_path_factory.mktemp("nemo"))


def _stored(archive: Path) -> dict:
    """The state dict as NeMo restores it: the member extracted by tarfile, then torch.load."""
    import torch

    with tarfile.open(archive, "r:") as tar:
        data = tar.extractfile("./model_weights.ckpt").read()
    return torch.load(io.BytesIO(data), weights_only=True)


def test_every_tensor_is_read_from_inside_the_archive_bit_for_bit(nemo):
    import torch

    stored = _stored(nemo["llama"])
    tensors = {k: v for k, v in stored.items() if isinstance(v, torch.Tensor)}
    assert len(tensors) > 10 and all(k.startswith("model.") for k in tensors)
    result = run_cli("inspect", "--json", str(nemo["llama"]))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["format"] == "nemo" and {t["name"] for t in doc["tensors"]} == set(tensors)
    assert {f["path"] for f in doc["metadata"]["files"]} == {"llama.nemo"}
    config = next(o for o in doc["objects"] if o["name"] == "nemo_model_config")
    assert config["type"] == "dict"
    with open_checkpoint(nemo["llama"]) as reader:
        for name, value in tensors.items():
            got = reader.read(name)
            assert got.shape == tuple(value.shape) and got.tobytes() == value.numpy().tobytes(), name
        assert reader.index().tensors[next(iter(tensors))].files == ("llama.nemo",)
    result = run_cli("check", str(nemo["llama"]))
    assert result.code == 0, result.out


def test_metadata_path_imports_no_torch(nemo):
    assert_no_torch_on_metadata_path(nemo["llama"], read="model.embedding.word_embeddings.weight")


def test_convert_to_hf_gives_the_model_transformers_loads(nemo, tmp_path):
    """With the HF config beside it (NeMo's model_config.yaml has no vocabulary size): the export is the
    hf_llama_gqa model bit for bit, and transformers loads it with nothing missing."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    result = run_cli("convert", str(nemo["llama"]), str(out), "--to", "hf", "--hf-config", str(SAMPLES / "hf_llama_gqa"))
    assert result.code == 0, result.err
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    want = load_file(str(SAMPLES / "hf_llama_gqa" / "model.safetensors"))
    got = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name, value in want.items():
        assert np.array_equal(got[name], value), name


def test_without_an_hf_config_the_nemo_config_is_the_model_config(nemo, tmp_path):
    """model_config.yaml read as Megatron args (``mappings.nemo1_config``): the export needs no HF config,
    keeps the padded vocabulary rows (NeMo keeps the true size in the tokenizer) and says so; transformers
    computes hf_llama_gqa's logits over the real vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    result = run_cli("convert", str(nemo["llama"]), str(out), "--to", "hf")
    assert result.code == 0, result.err
    assert "true vocabulary size is unknown" in result.err
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    reference = AutoModelForCausalLM.from_pretrained(str(SAMPLES / "hf_llama_gqa"), dtype=torch.float32)
    vocab = reference.config.vocab_size
    tokens = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model(tokens).logits[..., :vocab], reference(tokens).logits
    assert torch.equal(got, want)


def test_an_hf_config_that_says_another_model_is_refused(nemo, tmp_path):
    config = json.loads((SAMPLES / "hf_llama_gqa" / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 500000.0
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(nemo["llama"]), str(tmp_path / "hf"), "--to", "hf", "--hf-config", str(tmp_path / "cfg"))
    assert result.code == 2 and "rope_theta 500000.0" in result.err and "rotary_base 10000" in result.err, result.err
    assert not (tmp_path / "hf").exists()


def test_a_nemo_config_setting_with_no_translation_asks_for_the_hf_config(nemo, tmp_path):
    """Llama 3.1's RoPE scaling (``scale_positional_embedding``) is not read: the config as a whole is not
    used, so the export needs an HF config instead of writing one without the scaling."""
    import make_nemo_samples
    import yaml

    folder = tmp_path / "folder"
    with tarfile.open(nemo["llama"], "r:") as tar:
        tar.extractall(folder, filter="data")
    config = yaml.safe_load((folder / "model_config.yaml").read_text())
    config["scale_positional_embedding"] = True
    (folder / "model_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    scaled = make_nemo_samples._archive(folder, tmp_path / "scaled.nemo")
    result = run_cli("convert", str(scaled), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and "--hf-config" in result.err and "Traceback" not in result.err, result.err


def test_the_reader_and_the_mapping_name_the_config_object_alike():
    from ckptscope.formats.nemo.reader import CONFIG_OBJECT
    from ckptscope.mappings.nemo1_config import NEMO1_CONFIG

    assert CONFIG_OBJECT == NEMO1_CONFIG


@pytest.mark.parametrize("name, words", [
    ("llama_gz", ["gzip-compressed", "tar -xzf llama_gz.nemo"]),
    ("llama_tp2", ["2 model-parallel ranks", "mp_rank_00/model_weights.ckpt"]),
    ("llama_dist", ["Megatron-Core distributed checkpoint", "DIR/model_weights"]),
])
def test_layouts_not_read_in_place_are_one_line_saying_how_to_open_them(nemo, name, words):
    for command in (["inspect"], ["check"], ["convert", "--to", "hf"]):
        args = [*command[:1], str(nemo[name]), *(["/tmp/never-written"] if command[0] == "convert" else []), *command[1:]]
        result = run_cli(*args)
        assert result.code == 2, (command, result.out, result.err)
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and all(w in lines[0] for w in words) and "Traceback" not in result.err, result.err


def test_the_dist_layouts_hint_works(nemo, tmp_path):
    """Extracted as the error says, its model_weights/ opens as the Megatron-Core checkpoint it is."""
    with tarfile.open(nemo["llama_dist"], "r:") as tar:
        tar.extractall(tmp_path, filter="data")
    result = run_cli("inspect", "--json", str(tmp_path / "model_weights"))
    assert result.code == 0, result.err
    assert json.loads(result.out)["format"] == "megatron_dist"


def test_a_truncated_or_foreign_nemo_is_one_line(nemo, tmp_path):
    data = nemo["llama"].read_bytes()
    cut = tmp_path / "cut.nemo"
    cut.write_bytes(data[: len(data) // 2])
    junk = tmp_path / "junk.nemo"
    junk.write_bytes(b"not a tar at all" * 64)
    for path in (cut, junk):
        result = run_cli("inspect", str(path))
        assert result.code == 2, result.out
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.err and str(path.name) in lines[0], result.err


def test_a_model_config_that_is_not_plain_yaml_is_a_warning(nemo, tmp_path):
    """A Python tag in model_config.yaml is never followed: the config is unknown (said), the weights still read."""
    import make_nemo_samples

    folder = tmp_path / "folder"
    with tarfile.open(nemo["llama"], "r:") as tar:
        tar.extractall(folder, filter="data")
    (folder / "model_config.yaml").write_text("num_layers: !!python/object/apply:os.system ['true']\n")
    tagged = make_nemo_samples._archive(folder, tmp_path / "tagged.nemo")
    result = run_cli("inspect", "--json", str(tagged))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert any("model_config.yaml inside the archive: not plain YAML" in w for w in doc["metadata"]["warnings"])
    assert not any(o["name"] == "nemo_model_config" for o in doc["objects"]) and len(doc["tensors"]) > 10
