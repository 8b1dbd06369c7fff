"""``rename`` of Megatron torch_dist and plain DCP dirs: only ``.metadata`` changes, data files are reused.

Every check uses the writers' own loaders as ground truth: torch's ``dcp.load`` /
``_load_state_dict_from_keys`` (``FileSystemReader``) and megatron-core's ``dist_checkpointing.load``.
The shipped samples are copied into tmp_path so the source can be hashed before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from dist_reference import MEGATRON_ITER, SAMPLES, torch_dcp_tensors

from ckptscope.formats.dcp.metadata_rename import nested_path

QKV_SUB = ("linear_qkv", "qkv_proj")


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def read_metadata(path: Path):
    """torch's own reader of ``.metadata`` (plain pickle.load of the real classes)."""
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(path)).read_metadata()


def item_bytes(ckpt: Path, key: str) -> bytes:
    """The stored bytes of a bytes entry, located through torch's own metadata."""
    md = read_metadata(ckpt)
    (info,) = [v for k, v in md.storage_data.items() if k.fqn == key]
    with open(ckpt / info.relative_path, "rb") as handle:
        handle.seek(info.offset)
        return handle.read(info.length)


def load_from_keys(path: Path) -> dict:
    """torch's nested load driven by ``planner_data`` (needs no pre-allocated targets)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _load_state_dict_from_keys(checkpoint_id=str(path))


def same_bits(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
    return a == b


def flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in flat(sub, f"{prefix}{i}.").items()}
    return {prefix[:-1]: tree}


def copy_sample(src: Path, tmp_path: Path, name: str = "src") -> Path:
    target = tmp_path / name
    shutil.copytree(src, target)
    return target


@pytest.fixture
def mega(tmp_path) -> Path:
    return copy_sample(MEGATRON_ITER, tmp_path)


# --- Megatron torch_dist -----------------------------------------------------------------------


def test_megatron_rename_and_drop_keeps_bits_and_links_data(mega, tmp_path, cli):
    before = tree_hashes(mega)
    dst = tmp_path / "renamed"
    result = cli("rename", str(mega), str(dst), "--sub", *QKV_SUB, "--drop", r"linear_fc2\.")
    assert result.code == 0, result.err
    assert tree_hashes(mega) == before, "the source changed"

    original, renamed = torch_dcp_tensors(mega), torch_dcp_tensors(dst)
    expected = {k.replace(*QKV_SUB): v for k, v in original.items() if "linear_fc2." not in k}
    assert set(renamed) == set(expected) and any("qkv_proj" in k for k in renamed)
    for name, array in expected.items():
        assert renamed[name].dtype == array.dtype and np.array_equal(renamed[name], array), name

    # ShardedObjects follow their module: qkv's _extra_state is renamed, fc2's is dropped, rng stays.
    old_md, new_md = read_metadata(mega), read_metadata(dst)
    old_bytes = {k for k in old_md.state_dict_metadata if k not in original}
    new_bytes = {k for k in new_md.state_dict_metadata if k not in renamed}
    assert new_bytes == {k.replace(*QKV_SUB) for k in old_bytes if "linear_fc2." not in k}
    qkv_state = "decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2"
    assert item_bytes(dst, qkv_state.replace(*QKV_SUB)) == item_bytes(mega, qkv_state)
    assert item_bytes(dst, "rng_state/shard_0.1_1.2") == item_bytes(mega, "rng_state/shard_0.1_1.2")
    assert type(new_md).__name__ == "Metadata" and not hasattr(new_md, "all_local_plans")
    assert new_md.planner_data is None and new_md.version == old_md.version
    assert str(new_md.storage_meta.checkpoint_id) == str(dst.resolve())
    assert new_md.storage_meta.save_id == old_md.storage_meta.save_id

    for data in mega.glob("*.distcp"):
        a, b = data.stat(), (dst / data.name).stat()
        assert (a.st_ino == b.st_ino) or (dst / data.name).read_bytes() == data.read_bytes()
    for name in ("metadata.json", "common.pt"):
        assert (dst / name).read_bytes() == (mega / name).read_bytes()
    assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in mega.iterdir())

    inspected = cli("inspect", str(dst), "--json")
    assert inspected.code == 0, inspected.err
    data = json.loads(inspected.out)
    assert data["format"] == "megatron_dist"
    names = {t["name"] for t in data["tensors"]}
    assert names == set(expected)
    assert data["metadata"]["iteration"] == 10


MEGATRON_LOAD = r'''
import json, os, re, sys, tempfile, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[4])
import make_dist_samples as g
import torch, torch.distributed as dist
import torch.nn.functional as F
ckpt, subs, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + tempfile.mkdtemp() + "/rdv", rank=0, world_size=1)
g._stub_cuda()
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
config = TransformerConfig(**g.TINY_GPT, gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
    normalization="RMSNorm", use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16)
model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                 vocab_size=g.VOCAB, max_sequence_length=g.SEQ, share_embeddings_and_output_weights=True,
                 position_embedding_type="rope")
with torch.no_grad():
    for p in model.parameters():
        p.zero_()
def new_key(key):
    for pat, repl in subs:
        key = re.sub(pat, repl, key)
    return key
requested = []
def rename(x):
    if isinstance(x, (ShardedTensor, ShardedObject)):
        x.key = new_key(x.key)
        requested.append(x.key)
    return x
sharded = model.sharded_state_dict()
dict_list_map_inplace(rename, sharded)
model.load_state_dict(dist_checkpointing.load(sharded, ckpt), strict=False)
pieces = [(new_key(sh.key), list(sh.global_offset), sh.data.detach().float().numpy().tolist())
          for sh in model.sharded_state_dict().values() if isinstance(sh, ShardedTensor)]
# linear_fc1 is saved through the SwiGLU ShardedTensorFactory: with TP=1 each layer's weight is the
# stored global tensor's slice at that layer.
pieces += [(new_key("decoder.layers.mlp.linear_fc1.weight"), [i, 0, 0], layer.mlp.linear_fc1.weight.detach().float().numpy().tolist())
           for i, layer in enumerate(model.decoder.layers)]
json.dump({"requested": requested, "pieces": pieces}, open(out, "w"))
dist.destroy_process_group()
'''


def test_megatron_core_loads_renamed_checkpoint(mega, tmp_path, cli):
    """megatron-core's own ``dist_checkpointing.load`` of a GPTModel (TP=1, one gloo rank) whose
    sharded state dict asks for the new keys, ShardedObjects (``_extra_state``) included."""
    dst = tmp_path / "renamed"
    assert cli("rename", str(mega), str(dst), "--sub", *QKV_SUB).code == 0
    script, out = tmp_path / "load.py", tmp_path / "loaded.json"
    script.write_text(MEGATRON_LOAD)
    proc = subprocess.run([sys.executable, str(script), str(dst), json.dumps([QKV_SUB]), str(out), str(SAMPLES)],
                          check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(out.read_text())
    assert "decoder.layers.self_attention.qkv_proj._extra_state" in loaded["requested"]
    assert not any("linear_qkv" in k for k in loaded["requested"])
    original = torch_dcp_tensors(mega)
    assert {k for k, _, _ in loaded["pieces"]} >= {k.replace(*QKV_SUB) for k in original
                                                  if not k.startswith("optimizer.")}
    for key, offset, values in loaded["pieces"]:
        full = original[key.replace(QKV_SUB[1], QKV_SUB[0])]
        got = np.asarray(values)
        if len(offset) == got.ndim + 1:  # a stacked layer: the leading axis is the layer index
            full, offset = full[offset[0]], offset[1:]
        window = full[tuple(slice(o, o + n) for o, n in zip(offset, got.shape))]
        assert np.array_equal(window, got), key


def test_megatron_save_root_is_refused(tmp_path, cli):
    root = copy_sample(MEGATRON_ITER.parent, tmp_path, "root")
    result = cli("rename", str(root), str(tmp_path / "out"), "--sub", *QKV_SUB)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "out").exists()


# --- plain DCP ---------------------------------------------------------------------------------


def test_fsdp2_rename_nested_load_and_objects_follow(tmp_path, cli):
    src = copy_sample(SAMPLES / "dcp_fsdp2", tmp_path)
    before = tree_hashes(src)
    dst = tmp_path / "renamed"
    result = cli("rename", str(src), str(dst), "--sub", r"^model\.", "net.", "--sub", r"^optim\.", "optimizer.")
    assert result.code == 0, result.err
    assert tree_hashes(src) == before

    old, new = flat(load_from_keys(src)), flat(load_from_keys(dst))
    def moved(k: str) -> str:
        return "net." + k[6:] if k.startswith("model.") else "optimizer." + k[6:] if k.startswith("optim.") else k
    assert set(new) == {moved(k) for k in old}  # tensors and bytes leaves (param_groups) alike
    for key, value in old.items():
        assert same_bits(new[moved(key)], value), key
    tree = load_from_keys(dst)
    assert isinstance(tree["optimizer"]["param_groups"], list)  # list index kept an int in planner_data
    assert tree["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-3)
    assert tree["train_state"] == {"step": 3, "tokens_seen": 4096}

    # dcp.load into pre-allocated targets under the new names (the sharded chunks reassemble)
    original, renamed = torch_dcp_tensors(src), torch_dcp_tensors(dst)
    assert {moved(k) for k in original} == set(renamed)
    for key, array in original.items():
        assert np.array_equal(renamed[moved(key)], array), key
    for data in src.glob("*.distcp"):
        assert (dst / data.name).stat().st_ino == data.stat().st_ino or \
            (dst / data.name).read_bytes() == data.read_bytes()


def test_nested_map_and_drop(tmp_path, cli):
    src = copy_sample(SAMPLES / "dcp_nested", tmp_path)
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"model.embed.weight": "model.tok_embeddings.weight",
                                   "counts": "stats.counts"}))
    dst = tmp_path / "renamed"
    result = cli("rename", str(src), str(dst), "--map", str(mapping), "--drop", r"^optimizer\.state\.2\.")
    assert result.code == 0, result.err
    old, new = flat(load_from_keys(src)), flat(load_from_keys(dst))
    renames = {"model.embed.weight": "model.tok_embeddings.weight", "counts": "stats.counts"}
    expected = {renames.get(k, k): v for k, v in old.items() if not k.startswith("optimizer.state.2.")}
    assert set(new) == set(expected)
    for key, value in expected.items():
        assert same_bits(new[key], value), key
    tree = load_from_keys(dst)
    assert tree["step"] == 5 and "stats.counts" in tree and isinstance(tree["optimizer"]["param_groups"], list)
    md = read_metadata(dst)
    assert md.planner_data["stats.counts"] == ("stats.counts",)  # depth kept: one part, like "counts"
    assert md.planner_data["model.tok_embeddings.weight"] == ("model", "tok_embeddings.weight")


def test_dry_run_writes_nothing(tmp_path, cli):
    src = copy_sample(SAMPLES / "dcp_nested", tmp_path)
    dst = tmp_path / "dry"
    result = cli("rename", str(src), str(dst), "--sub", r"layers\.1\.", "layers.9.", "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    assert plan["dry_run"] is True and plan["format"] == "dcp"
    assert {r["new"] for r in plan["renamed"]} == {"model.layers.9.weight", "model.layers.9.bias"}
    assert {f["path"]: f["action"] for f in plan["files"]} == {".metadata": "regenerate", "__0_0.distcp": "link"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("args,fragment", [
    (("--sub", r"layers\.\d\.", "layers.X."), "names would collide"),
    (("--sub", r"^counts$", "step"), "names would collide (objects follow their module's tensors): 'counts', 'step' -> 'step'"),
    (("--sub", r"^optimizer\.state\.0\.momentum_buffer$", "optimizer.state"), "nest inside each other"),
    (("--sub", r"no_such_thing", "x"), "pattern matches no tensor: --sub 'no_such_thing'"),
    (("--drop", r"^nothing$"), "pattern matches no tensor: --drop '^nothing$'"),
])
def test_bad_plans_exit_2_and_write_nothing(tmp_path, cli, args, fragment):
    src = copy_sample(SAMPLES / "dcp_nested", tmp_path)
    result = cli("rename", str(src), str(tmp_path / "never"), *args)
    assert result.code == 2, result.err
    assert fragment in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "something was written"


def test_existing_destination_needs_overwrite(tmp_path, cli):
    src = copy_sample(SAMPLES / "dcp_nested", tmp_path)
    dst = tmp_path / "exists"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    result = cli("rename", str(src), str(dst), "--drop", "^counts$")
    assert result.code == 2 and "--overwrite" in result.err
    assert (dst / "keep.txt").read_text() == "mine"
    assert cli("rename", str(src), str(dst), "--drop", "^counts$", "--overwrite").code == 0
    assert not (dst / "keep.txt").exists() and "counts" not in read_metadata(dst).state_dict_metadata


def test_safetensors_serialised_dcp_is_refused(tmp_path, cli):
    src = copy_sample(SAMPLES / "dcp_safetensors", tmp_path)
    result = cli("rename", str(src), str(tmp_path / "o"), "--sub", "w", "weight")
    assert result.code == 2 and "torch_save serialisation only" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_written_metadata_is_plain_torch_classes(mega, tmp_path, cli):
    """The regenerated pickle names torch's classes only: no ckptscope or megatron class leaks in."""
    dst = tmp_path / "renamed"
    assert cli("rename", str(mega), str(dst), "--sub", *QKV_SUB).code == 0
    strings = [arg for _, arg, _ in pickletools.genops((dst / ".metadata").read_bytes()) if isinstance(arg, str)]
    assert "torch.distributed.checkpoint.metadata" in strings
    assert not [s for s in strings if s.startswith(("ckptscope", "megatron"))]
    assert isinstance(pickle.loads((dst / ".metadata").read_bytes()).state_dict_metadata, dict)


def test_nested_path_keeps_structure():
    assert nested_path(("model", "layers.0.weight"), "model.blocks.0.weight") == ("model", "blocks.0.weight")
    assert nested_path(("optim", "param_groups", 0, "lr"), "optimizer.param_groups.0.lr") == \
        ("optimizer", "param_groups", 0, "lr")
    assert nested_path(("optim", "state", "0.weight", "exp_avg"), "optim.state.blk.0.weight.exp_avg") == \
        ("optim", "state", "blk.0.weight", "exp_avg")
    assert nested_path(("a", 0, "c"), "a.1.c") == ("a", 1, "c")
    assert nested_path(("model", "w"), "w") == ("w",)


# --- the torch-free writer ---------------------------------------------------------------------


NO_TORCH_RENAME = r'''
import json, sys
from ckptscope.ops.rename.engine import execute_rename, plan_rename
plan = plan_rename(sys.argv[1], sys.argv[2], subs=[("linear_qkv", "qkv_proj")], drops=[r"linear_fc2\."])
execute_rename(plan)
print(json.dumps({"torch": any(m.split(".")[0] == "torch" for m in sys.modules),
                  "megatron": any(m.split(".")[0] == "megatron" for m in sys.modules)}))
'''


def test_rename_path_imports_neither_torch_nor_megatron(mega, tmp_path):
    """plan + execute of a torch_dist rename in a fresh interpreter: ``.metadata`` is rewritten
    without importing torch (seconds of import time) or megatron."""
    dst = tmp_path / "renamed"
    proc = subprocess.run([sys.executable, "-c", NO_TORCH_RENAME, str(mega), str(dst)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"torch": False, "megatron": False}
    keys = set(read_metadata(dst).state_dict_metadata)
    assert any("qkv_proj" in k for k in keys) and not any("linear_qkv" in k or "linear_fc2." in k for k in keys)


def torch_reference(src: Path, keys: dict, checkpoint_id: str):
    """What the rename must produce, built with torch's own classes from torch's own reading of
    the source (test-only: the source is trusted here)."""
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta

    md = pickle.loads((src / ".metadata").read_bytes())
    def new(key):
        return keys.get(key, key)
    planner = None
    if md.planner_data is not None:
        planner = {new(k): p if new(k) == k else nested_path(p, new(k))
                   for k, p in md.planner_data.items() if new(k) is not None}
    old_meta = md.storage_meta
    expected = Metadata(
        state_dict_metadata={new(k): v for k, v in md.state_dict_metadata.items() if new(k) is not None},
        planner_data=planner,
        storage_data={MetadataIndex(new(i.fqn), i.offset, i.index): info for i, info in md.storage_data.items()
                      if new(i.fqn) is not None},
        storage_meta=StorageMeta(checkpoint_id=type(old_meta.checkpoint_id)(checkpoint_id), save_id=old_meta.save_id,
                                 load_id=old_meta.load_id, modules=old_meta.modules),
        version=md.version)
    for name, value in vars(md).items():
        if not hasattr(expected, name) and name != "all_local_plans":
            setattr(expected, name, {new(k): v for k, v in value.items()} if name == "mcore_data" else value)
    return expected


def assert_same_objects(got, want, path: str = "metadata") -> None:
    """Field by field, with exact types (``torch.Size`` stays ``torch.Size``, ints stay ints) and
    the same order of every mapping."""
    import torch

    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert len(got) == len(want), path
        for (gk, gv), (wk, wv) in zip(got.items(), want.items()):
            assert_same_objects(gk, wk, f"{path} key {wk!r}")
            assert_same_objects(gv, wv, f"{path}[{wk!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_objects(g, w, f"{path}[{i}]")
    elif hasattr(want, "__dict__") and not isinstance(want, (type, torch.dtype, torch.layout, torch.memory_format)):
        assert vars(got).keys() == vars(want).keys(), path
        for name in vars(want):
            assert_same_objects(vars(got)[name], vars(want)[name], f"{path}.{name}")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


@pytest.mark.parametrize("sample,args", [
    ("megatron", {"subs": [QKV_SUB], "drops": [r"linear_fc2\."]}),
    ("megatron", {"subs": [(r"^decoder\.", "dec.")]}),
    ("dcp_fsdp2", {"subs": [(r"^model\.", "net."), (r"^optim\.", "optimizer.")]}),
    ("dcp_nested", {"mapping": {"model.embed.weight": "model.tok_embeddings.weight", "counts": "stats.counts"},
                    "drops": [r"^optimizer\.state\.2\."]}),
])
def test_written_metadata_equals_torch_rebuilt_metadata(tmp_path, sample, args):
    """The stub-tree writer gives the very objects torch's own classes give for the same rename:
    same fields, same types, same order, for Megatron torch_dist and plain DCP alike."""
    from ckptscope.formats.dcp.metadata import load_dcp_metadata
    from ckptscope.ops.rename.dcp import stored_key_changes
    from ckptscope.ops.rename.engine import execute_rename, plan_rename

    src = copy_sample(MEGATRON_ITER if sample == "megatron" else SAMPLES / sample, tmp_path)
    dst = tmp_path / "renamed"
    plan = plan_rename(src, dst, **args)
    execute_rename(plan)
    keys = stored_key_changes(load_dcp_metadata(src / ".metadata"), plan.changes, src)
    want = torch_reference(src, keys, str(dst.resolve()))
    got = pickle.loads((dst / ".metadata").read_bytes())
    assert_same_objects(got, want)
    assert got == want
    assert pickletools.genops((dst / ".metadata").read_bytes()).__next__()[1] == 4  # protocol, as torch writes
    read_metadata(dst)  # and torch's FileSystemReader takes it


def rewrite_metadata(ckpt: Path, **attrs) -> None:
    """Add attributes to a copied sample's ``.metadata`` with torch's own pickling (test-only)."""
    md = pickle.loads((ckpt / ".metadata").read_bytes())
    for name, value in attrs.items():
        setattr(md, name, value)
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))


def test_mcore_data_is_rekeyed_and_plain_extras_kept(tmp_path, cli):
    src = copy_sample(SAMPLES / "dcp_nested", tmp_path)
    rewrite_metadata(src, mcore_data={"model.embed.weight": {"nd_reformulated_orig_global_shape": (10, 4)},
                                      "counts": {"x": 1}}, note={"kept": [1, 2.5, "x"]})
    dst = tmp_path / "renamed"
    result = cli("rename", str(src), str(dst), "--sub", r"^model\.embed\.", "model.tok.", "--drop", "^counts$")
    assert result.code == 0, result.err
    md = read_metadata(dst)
    assert md.mcore_data == {"model.tok.weight": {"nd_reformulated_orig_global_shape": (10, 4)}}
    assert md.note == {"kept": [1, 2.5, "x"]}


def test_unknown_object_in_metadata_is_refused_in_one_line(tmp_path, cli):
    import torch

    src = copy_sample(SAMPLES / "dcp_nested", tmp_path)
    rewrite_metadata(src, odd=torch.device("cpu"))
    result = cli("rename", str(src), str(tmp_path / "never"), "--drop", "^counts$")
    assert result.code == 2, result.err
    assert "cannot carry over metadata attribute 'odd': it holds torch.device" in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "something was written"


# --- torch's flattened optimizer state (torchtitan's layout) -----------------------------------------


def _flat_optimizer_save(path: Path, name: str = "layers"):
    """A model and its AdamW state saved as torchtitan saves them: model keys at the top level, the
    optimizer flattened by torch (``<opt>.state.<param>.exp_avg`` tensors, ``<opt>.param_groups.<param>.lr``
    leaves), written by torch DCP itself. Returns the model, its optimizer and a batch."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            setattr(self, name, nn.ModuleList(nn.Linear(8, 8) for _ in range(2)))
            self.head = nn.Linear(8, 10, bias=False)

        def forward(self, x):
            h = self.embed(x)
            for layer in getattr(self, name):
                h = torch.tanh(layer(h))
            return self.head(h)

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.8, 0.95))
    batch = torch.randint(0, 10, (4, 5))
    if path is not None:
        for _ in range(2):
            net(batch).sum().backward()
            opt.step()
            opt.zero_grad()
        msd, osd = get_state_dict(net, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({**msd, "optimizer": osd}, checkpoint_id=str(path))
    return net, opt, batch


def test_flattened_optimizer_settings_follow_their_parameter(tmp_path, cli):
    """torchtitan resumes a renamed save: the per-parameter settings (``param_groups.<param>.lr`` ...)
    move with the parameter's state (a probe: they stayed under the old names and
    ``set_optimizer_state_dict`` failed with "Missing key ... param_groups.model.blocks.0 ... lr")."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    src, dst = tmp_path / "step-10", tmp_path / "renamed"
    original, original_opt, batch = _flat_optimizer_save(src)
    result = cli("rename", str(src), str(dst), "--sub", r"layers\.", "blocks.")
    assert result.code == 0, result.err
    keys = set(read_metadata(dst).state_dict_metadata)
    assert "optimizer.param_groups.blocks.0.weight.lr" in keys
    assert not [k for k in keys if "layers." in k]

    net, opt, _ = _flat_optimizer_save(None, name="blocks")  # the renamed model, as a user would build it
    opt_options = StateDictOptions(flatten_optimizer_state_dict=True)
    msd, osd = get_state_dict(net, opt, options=opt_options)
    state = {**msd, "optimizer": osd}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(dst))
    optimizer_state = state.pop("optimizer")
    set_state_dict(net, opt, model_state_dict=state, optim_state_dict=optimizer_state, options=opt_options)
    assert opt.param_groups[0]["betas"] == (0.8, 0.95)
    for o, n in zip(original_opt.state.values(), opt.state.values()):
        assert torch.equal(o["exp_avg"], n["exp_avg"]) and torch.equal(o["exp_avg_sq"], n["exp_avg_sq"])
    # one more step of each lands on the same weights: the resume is exact
    for model, optimizer in ((original, original_opt), (net, opt)):
        model(batch).sum().backward()
        optimizer.step()
    for (_, a), (_, b) in zip(original.named_parameters(), net.named_parameters()):
        assert torch.equal(a, b)


def test_flattened_optimizer_settings_are_dropped_with_their_parameter(tmp_path, cli):
    src, dst = tmp_path / "step-10", tmp_path / "dropped"
    _flat_optimizer_save(src)
    result = cli("rename", str(src), str(dst), "--drop", r"head\.")
    assert result.code == 0, result.err
    keys = set(read_metadata(dst).state_dict_metadata)
    assert not [k for k in keys if "head." in k]
    assert "optimizer.param_groups.embed.weight.lr" in keys  # the others stay


def test_param_group_list_is_not_taken_for_flattened_settings(tmp_path, cli):
    """``optimizer.state_dict()`` saved as it is keys its state by parameter id (``optim.state.0.exp_avg``)
    and its groups by index (``optim.param_groups.0.lr``): dropping parameter 0's state must not drop
    group 0's settings, which every parameter of the group shares."""
    import torch.distributed.checkpoint as dcp

    net, opt, batch = _flat_optimizer_save(None)
    net(batch).sum().backward()
    opt.step()
    src, dst = tmp_path / "ids", tmp_path / "dropped"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": net.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(src))
    result = cli("rename", str(src), str(dst), "--drop", r"^optim\.state\.0\.")
    assert result.code == 0, result.err
    keys = set(read_metadata(dst).state_dict_metadata)
    assert "optim.param_groups.0.lr" in keys and not [k for k in keys if k.startswith("optim.state.0.")]
