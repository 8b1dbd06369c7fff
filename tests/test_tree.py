"""Repeated layers collapse into ranges; anything that differs breaks the range."""

from ckptscope.core.tensor import TensorMeta
from ckptscope.ops.tree import build_tree


def meta(name: str, shape=(4, 4), dtype="bfloat16") -> TensorMeta:
    return TensorMeta(name=name, dtype=dtype, shape=shape)


def find(node, label):
    return next(child for child in node.children if child.label == label)


def test_identical_layers_collapse_and_counts_add_up():
    tensors = [meta(f"model.layers.{i}.{p}") for i in range(32) for p in ("attn.weight", "mlp.weight")]
    tensors += [meta("model.embed.weight", (10, 4))]
    tree = build_tree(tensors)
    layers = find(find(tree, "model"), "layers")
    (rng,) = layers.children
    assert rng.label == "[0-31]" and rng.repeat == 32
    assert rng.members[0] == "model.layers.0" and rng.members[-1] == "model.layers.31"
    assert rng.num_params == 32 * 2 * 16
    assert rng.num_tensors == 64
    assert rng.nbytes == 32 * 2 * 16 * 2
    assert tree.num_params == sum(t.numel for t in tensors)
    assert [label for label, _ in find(tree, "model").folded_children()] == ["embed.weight", "layers.[0-31]"]


def test_different_layer_breaks_the_run():
    tensors = [meta(f"layers.{i}.w") for i in range(6)]
    tensors[0] = meta("layers.0.w", (8, 4))           # dense first layer
    tensors[4] = meta("layers.4.w", dtype="float32")  # a different dtype
    labels = [c.label for c in build_tree(tensors).children[0].children]
    assert labels == ["0", "[1-3]", "4", "5"]


def test_gaps_and_numeric_order():
    tensors = [meta(f"blocks.{i}.w") for i in (0, 1, 2, 10, 11, 9)]
    labels = [c.label for c in build_tree(tensors).children[0].children]
    assert labels == ["[0-2]", "[9-11]"]


def test_no_collapse_keeps_every_layer():
    tensors = [meta(f"layers.{i}.w") for i in range(3)]
    labels = [c.label for c in build_tree(tensors, collapse=False).children[0].children]
    assert labels == ["0", "1", "2"]
