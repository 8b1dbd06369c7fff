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


def test_totals_of_every_node_equal_the_sum_over_its_tensors():
    """Totals are summed bottom-up once; check each node against a direct sum over names,
    including a tensor that is also a module prefix and a sub-byte dtype."""
    tensors = [meta("a.w", (3, 5)), meta("a", (7,)), meta("a.b.c", (2, 2), "float32"),
               meta("a.b.d", (5,), "float4_e2m1fn"), meta("z", ())]
    tree = build_tree(tensors, collapse=False)
    for node in tree.walk():
        below = [t for t in tensors if not node.path or t.name == node.path or t.name.startswith(node.path + ".")]
        assert node.num_tensors == len(below), node.path
        assert node.num_params == sum(t.numel for t in below), node.path
        assert node.nbytes == sum(t.nbytes for t in below), node.path


def test_tree_is_freed_without_the_cyclic_collector():
    """Opening runs with the collector paused (issue 15): a tree that held a reference cycle would
    stay alive until the collector ran, then cost a walk over every node."""
    import gc

    metas = [TensorMeta(f"model.layers.{i}.mlp.experts.{j}.w", "float32", (2,)) for i in range(20) for j in range(4)]
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        tree = build_tree(metas)
        assert tree.num_tensors == 80
        del tree
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_tied_weights_in_a_torch_save_count_once_in_the_tree_and_the_byte_totals(tmp_path):
    """A tied model's state dict saved with torch.save holds the embedding twice on one storage: the tree's
    totals said twice the parameters the summary line (and ``model.parameters()``) counts."""
    import pytest

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ckptscope.ops.inspect import inspect_checkpoint

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(config)
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    torch.save(state, tmp_path / "tied.bin")
    truth = sum(p.numel() for p in model.parameters())  # tied: counted once
    stored = sum(t.untyped_storage().nbytes() for n, t in state.items() if n != "lm_head.weight")

    report = inspect_checkpoint(tmp_path / "tied.bin")
    tree = report.tree()
    assert report.entries.num_params == tree.num_params == truth
    assert report.index.total_bytes == tree.nbytes == stored
    assert find(tree, "lm_head").num_params == find(find(tree, "model"), "embed_tokens").num_params == 96 * 16
    # under a wrapper (Lightning's state_dict.) the model's names are not the stored ones the tie names
    torch.save({"state_dict": state}, tmp_path / "wrapped.ckpt")
    wrapped = inspect_checkpoint(tmp_path / "wrapped.ckpt")
    assert wrapped.entries.prefix == "state_dict." and wrapped.entries.num_params == wrapped.tree().num_params == truth


def test_a_tensor_that_is_also_a_module_in_either_order():
    """Leaves live in their parent's children as tensors; a name that turns out to be a module too
    (``a`` before ``a.w``, or after it) keeps its tensor and its children either way."""
    first = [meta("a", (7,)), meta("a.w", (3, 5)), meta("a.b.c", (2, 2))]
    for tensors in (first, first[::-1]):
        tree = build_tree(tensors, collapse=False)
        (a,) = tree.children
        assert a.tensor is not None and a.tensor.name == "a"
        assert sorted(c.label for c in a.children) == ["b", "w"]
        assert a.num_tensors == 3 and a.num_params == 7 + 15 + 4


def test_numbered_leaf_tensors_collapse_and_open_as_members():
    tensors = [meta(f"experts.bias.{i}", (4,)) for i in range(4)] + [meta("experts.bias.4", (5,))]
    bias = build_tree(tensors).children[0].children[0]
    assert [c.label for c in bias.children] == ["[0-3]", "4"]
    rng = bias.children[0]
    assert rng.tensor is not None and rng.num_params == 16 and rng.num_tensors == 4
    member = rng.member("2")
    assert member.tensor.name == "experts.bias.2" and member.children == []
