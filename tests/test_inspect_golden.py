"""``inspect --json`` stays byte-identical while its internals are made faster (issue 15).

The checkpoints are written here by safetensors' own writer and cover what the fast paths special-case:
dtypes of every width (sub-byte packing aside), scalars and empty tensors, names a JSON encoder must
escape (quotes, backslashes, non-ASCII), training state and unknown entries beside the model, a
sharded HF dir whose index leaves a tensor out (a warning), and ``__metadata__``. The expected
documents in ``tests/data/inspect_golden/`` were captured from ckptscope before those fast paths
existed; the checkpoint's own path is replaced by ``@ROOT@`` so the files do not depend on tmp.
Set ``CKPTSCOPE_WRITE_GOLDEN=1`` to rewrite them after an intended change of the document.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

GOLDEN = Path(__file__).parent / "data" / "inspect_golden"
ODD = 'model.layers.1.self_attn.q_proj.weight\\"ñ€'
"""A model name with a backslash, a quote and non-ASCII characters (JSON must escape all three)."""


def _mixed() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "model.embed_tokens.weight": rng.standard_normal((16, 8)).astype(np.float16),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((4, 8)).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": np.arange(24, dtype=np.int8).reshape(3, 8),
        "model.layers.0.input_layernorm.weight": np.ones(8, np.float64),
        "model.layers.1.mlp.up_proj.weight": np.zeros((0, 8), np.float32),
        ODD: np.ones((2, 2), np.uint8),
        "model.norm.weight": np.ones(8, np.float32),
        "model.layers.1.self_attn.rotary_emb.inv_freq": np.array(3.0, np.float32),
        "model.layers.1.mlp.gate_proj.mask": np.array([True, False, True]),
        "lm_head.weight": rng.standard_normal((16, 8)).astype(np.float16),
        "optimizer.state.0.exp_avg": np.zeros((16, 8), np.float32),
        "rng_state.cuda": np.arange(5, dtype=np.int64),
        "ema.model.norm.weight": np.ones(8, np.float32),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("golden")
    tensors = _mixed()
    single = root / "mixed.safetensors"
    save_file(tensors, str(single), metadata={"note": "ünïcode"})  # one key: the writer's order of several varies
    sharded = root / "sharded"
    sharded.mkdir()
    names = list(tensors)
    weight_map = {}
    for i, part in enumerate((names[:5], names[5:10], names[10:])):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({n: tensors[n] for n in part}, str(sharded / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    del weight_map["ema.model.norm.weight"]  # stored but not indexed: an index-mismatch warning
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (sharded / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return {"mixed": single, "sharded": sharded}


@pytest.mark.parametrize("case", [
    ("mixed", ()), ("sharded", ()), ("sharded", ("--include", "model.layers.*", "--exclude", "*k_proj*")),
])
def test_inspect_json_is_byte_identical(checkpoints, cli, case):
    name, args = case
    path = checkpoints[name]
    result = cli("inspect", "--json", *args, str(path))
    assert result.code == 0, result.err
    got = result.out.replace(json.dumps(str(path))[1:-1], "@ROOT@")
    golden = GOLDEN / f"{name}{'-filtered' if args else ''}.json"
    if os.environ.get("CKPTSCOPE_WRITE_GOLDEN"):
        golden.write_text(got, encoding="utf-8")
    assert got == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("width", [30, 60, 160])
def test_plain_tree_is_what_rich_draws(width):
    """``print_tree`` writes the lines itself for plain output; they must be rich's, wrapping included
    (a row too wide, a tab or a control character goes to rich)."""
    import io

    from rich.console import Console
    from rich.text import Text
    from rich.tree import Tree

    from ckptscope.cli.render import print_tree

    def tree() -> Tree:
        root = Tree(Text.assemble(("model", "bold"), ("  1.2K params", "dim")))
        layers = root.add(Text("layers.[0-31]  ×32", style="bold blue"))
        for i in range(3):
            layer = layers.add(Text(f"{i}  mlp"))
            layer.add(Text("down_proj.weight  bfloat16 [4096, 11008]  45.1M  86.0 MiB"))
            layer.add(Text("名前.weight  float16 [8]  8  16 B"))  # wide characters: two cells each
        root.add(Text("tab\tinside"))
        root.add(Text("x" * 50))  # wraps at width 30
        return root

    def render(plain: bool) -> str:
        out = io.StringIO()
        console = Console(file=out, width=width, highlight=False, soft_wrap=False, color_system=None)
        print_tree(console, tree()) if plain else console.print(tree())
        return out.getvalue()

    assert render(True) == render(False)
    no_tab = tree()
    no_tab.children = [c for c in no_tab.children if "\t" not in c.label.plain and len(c.label.plain) < 50]
    out, expected = io.StringIO(), io.StringIO()

    class Plain(Console):
        def print(self, *args, **kwargs):  # the fast path must not need rich when every row fits
            raise AssertionError("print_tree fell back to rich")

    print_tree((Plain if width == 160 else Console)(file=out, width=width, color_system=None), no_tab)
    Console(file=expected, width=width, color_system=None).print(no_tab)
    assert out.getvalue() == expected.getvalue()


SAMPLES = Path(__file__).resolve().parents[1] / "sample_ckpts"


@pytest.mark.parametrize("name", ["dcp_fsdp2", "dcp_nested", "dcp_safetensors", "hf_llama_bin", "hf_llama_gqa",
                                  "megatron_style.pt", "legacy_format.pt", "dtypes.safetensors"])
def test_json_text_is_json_dumps_of_the_document(name):
    """``report_json_text`` (what ``inspect --json`` prints when piped) is ``json.dumps`` of
    ``report_to_json`` on the committed samples: FSDP2 tensors of several chunks, torch pickles,
    shared storages, every safetensors dtype."""
    from ckptscope.ops.inspect import inspect_checkpoint, report_json_chunks, report_json_text, report_to_json

    report = inspect_checkpoint(SAMPLES / name)
    if name == "dcp_fsdp2":
        assert any(len(t.chunks) > 1 for t in report.index.tensors.values())
    extra = {"layout": "x", "root": "ü"}
    expected = json.dumps(report_to_json(report) | extra)
    assert report_json_text(report, extra) == expected
    for batch in (1, 2, len(report.index.tensors)):  # the pieces join at any batch boundary
        assert "".join(report_json_chunks(report, extra, batch=batch)) == expected


def test_json_text_of_block_scaled_tensors(tmp_path):
    """FP8 block-scaled tensors carry a ``quantization`` object (written by transformers + torch)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ckptscope.ops.inspect import inspect_checkpoint, report_json_text, report_to_json
    from tests.blockscaled_fixtures import write_fp8_llama

    report = inspect_checkpoint(write_fp8_llama(tmp_path))
    assert any(t.quantization for t in report.index.tensors.values())
    assert report_json_text(report, {}) == json.dumps(report_to_json(report))
