"""Every writer gives the same bytes for the same input and options (issue 18, item 2).

Users checksum and cache checkpoints: a tool that rewrites one must not change bytes for nothing.
Each op below runs twice into the same destination path (the first result moved aside in between,
so any clock, random id or thread timing has its chance to differ), and every file of the two
results must hash the same, the same set of files included. The destination path is kept because
DCP's ``.metadata`` records where the checkpoint lives (``storage_meta.checkpoint_id``), as torch's
own writer does; that one field is the only one allowed to follow the path.

Where a writer has a concurrency knob (rename's file workers) the runs use different settings.
The ids formats stamp on their files are checked against the content they derive from: torch's
``.data/serialization_id`` equals what ``torch.save`` writes for the same records, and DCP's
``save_id`` changes with any tensor byte.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptscope.ops.convert.execute import execute_convert
from ckptscope.ops.convert.plan import plan_convert
from ckptscope.ops.rename.engine import execute_rename, plan_rename
from tests.conftest import REPO, load_sample_module

torch = pytest.importorskip("torch")

SAMPLES = REPO / "sample_ckpts"
HF = SAMPLES / "hf_llama_gqa"


def tree_digests(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (or of ``root`` itself), dotfiles included."""
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_twice_identical(write: Callable[[Path, int], None], dst: Path) -> dict[str, str]:
    """``write(dst, run)`` twice into ``dst``; the first result is moved aside, then compared."""
    write(dst, 0)
    first = tree_digests(dst)
    aside = dst.with_name(dst.name + ".first")
    shutil.move(dst, aside)
    write(dst, 1)
    second = tree_digests(dst)
    assert sorted(first) == sorted(second)
    differing = sorted(name for name in first if first[name] != second[name])
    assert not differing, f"bytes differ between two identical runs: {differing}"
    assert first  # something was written
    return second


def convert(src: Path, **options) -> Callable[[Path, int], None]:
    return lambda dst, run: execute_convert(plan_convert(src, dst, **options))


def test_hf_to_torch_dist(tmp_path):
    """Twice the same bytes, and every item (tensor chunks copied file to file, ShardedObjects) is
    the container ``torch.save`` makes of the object it holds, serialization id included."""
    from torch.distributed.checkpoint import FileSystemReader

    files = assert_twice_identical(convert(HF, to="mcore"), tmp_path / "mcore")
    assert {Path(f).name for f in files} >= {".metadata", "common.pt", "__0_0.distcp", "metadata.json"}
    iter_dir = tmp_path / "mcore" / "iter_0000000"
    storage = FileSystemReader(str(iter_dir)).read_metadata().storage_data
    assert storage
    for info in storage.values():
        item = (iter_dir / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
        again = io.BytesIO()
        torch.save(torch.load(io.BytesIO(item), weights_only=False), again)
        assert again.getvalue() == item, info


@pytest.mark.parametrize(("tp", "pp"), [(2, 2), (2, 1)])
def test_hf_to_legacy_rank_files(tmp_path, tp, pp):
    files = assert_twice_identical(convert(HF, to="mcore", ckpt_format="torch", tp=tp, pp=pp), tmp_path / "mcore")
    assert sum(f.endswith("model_optim_rng.pt") for f in files) == tp * pp


def test_torch_dist_to_hf(tmp_path):
    assert_twice_identical(convert(SAMPLES / "mcore_llama_gqa", to="hf"), tmp_path / "hf")


def test_megatron_legacy_to_hf(tmp_path):
    assert_twice_identical(convert(SAMPLES / "megatron_legacy_tp2", to="hf", arch="llama"), tmp_path / "hf")


def test_hf_sharded_output(tmp_path):
    """Several shards and an index: shard assignment and the index's order are fixed."""
    files = assert_twice_identical(convert(SAMPLES / "mcore_llama_gqa", to="hf", max_shard_size=100_000),
                                   tmp_path / "hf")
    assert "model.safetensors.index.json" in files


@pytest.fixture(scope="module")
def moe_hf(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    module = load_sample_module("make_moe_samples")
    return module.write_hf_moe("mixtral", tmp_path_factory.mktemp("moe"))


@pytest.mark.parametrize(("ckpt_format", "tp", "ep"), [("torch_dist", 1, 1), ("torch", 1, 2), ("torch", 2, 2)])
def test_moe_to_megatron(moe_hf, tmp_path, ckpt_format, tp, ep):
    assert_twice_identical(convert(moe_hf, to="mcore", ckpt_format=ckpt_format, tp=tp, ep=ep), tmp_path / "mcore")


@pytest.fixture(scope="module")
def dcp_llama(tmp_path_factory) -> Path:
    """The HF llama saved by torch's DCP writer on one process (what an FSDP2 trainer's
    ``dcp.save(model.state_dict())`` writes for this model)."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("dcp") / "llama"
    dcp.save(load_file(str(HF / "model.safetensors")), checkpoint_id=str(out), no_dist=True)
    return out


def test_dcp_merge_to_hf(dcp_llama, tmp_path):
    assert_twice_identical(convert(dcp_llama, to="hf", hf_config=HF), tmp_path / "hf")


def rename(src: Path, subs: tuple[tuple[str, str], ...], drops: tuple[str, ...] = ()) -> Callable[[Path, int], None]:
    """A rename; the second run uses one file worker where the first used four."""
    return lambda dst, run: execute_rename(plan_rename(src, dst, subs=subs, drops=drops), workers=(4, 1)[run])


@pytest.mark.parametrize(("sample", "subs", "drops"), [
    ("hf_llama_sharded", ((r"^model\.", "backbone."),), (r"layers\.1\.mlp",)),
    ("hf_llama_bin", ((r"^model\.", "backbone."),), ()),
    ("megatron_style.pt", ((r"^model\.model\.", "model.backbone."),), (r"^optimizer\.state\.",)),
    ("legacy_format.pt", ((r"weight", "w"),), ()),
    ("megatron_torch_dist/iter_0000010", ((r"linear_qkv", "qkv_proj"),), ()),
    ("dcp_fsdp2", ((r"^model\.0\.", "model.first."),), (r"^optim\.state\.2\.",)),
])
def test_rename(tmp_path, sample, subs, drops):
    src = SAMPLES / sample
    assert_twice_identical(rename(src, subs, drops), tmp_path / Path(sample).name)


@pytest.fixture(scope="module")
def peft(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("peft")
    module = load_sample_module("make_peft_samples")
    out = tmp_path_factory.mktemp("peft")
    return {name: module.WRITERS[name](out) for name in (module.BASE, "peft_lora")}


def test_lora_merge(peft, tmp_path):
    from ckptscope.ops.lora import execute_merge, plan_merge

    base = load_sample_module("make_peft_samples").BASE
    assert_twice_identical(lambda dst, run: execute_merge(plan_merge(peft["peft_lora"], peft[base], dst)),
                           tmp_path / "merged")


# --- the ids are derived from the content ---------------------------------------------------------------


def _records(path_or_bytes) -> dict[str, bytes]:
    source = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with zipfile.ZipFile(source) as archive:
        return {info.filename.split("/", 1)[1]: archive.read(info) for info in archive.infolist()}


@pytest.mark.parametrize("count", [0, 1, 2, 8, 9, 13, 14, 70, 600, 2400])
def test_container_serialization_id_is_torchs(tmp_path, count):
    """``zip_container`` stamps the id ``torch.save`` computes for the same records (a hash of the
    record names and the records' CRC-32s): the container is torch.save's, byte for byte."""
    from ckptscope.formats.torch_save.zip_container import write_torch_save

    tensors = [torch.arange(i + 1, dtype=torch.float32) * (i + 0.5) for i in range(count)]
    path = tmp_path / "archive"  # torch names the zip's folder after the file; ours is "archive"
    torch.save(tensors, path)
    ours = io.BytesIO()
    parsed = _records(path.read_bytes())
    storages = [(str(i), parsed[f"data/{i}"], None) for i in range(count)]
    write_torch_save(ours.write, parsed["data.pkl"], storages)
    assert _records(ours.getvalue())[".data/serialization_id"] == parsed[".data/serialization_id"]
    assert ours.getvalue() == path.read_bytes()


def _rewritten_by_torch(path: Path, dst: Path) -> bytes:
    """``path``'s records written again, in order, by torch's own zip writer (which computes the
    serialization id when the file ends)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    writer = torch._C.PyTorchFileWriter(str(dst))
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename.split("/", 1)[1]
            if name != ".data/serialization_id":
                data = archive.read(info)
                writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return dst.read_bytes()


def test_legacy_rank_file_id_is_torchs_for_the_real_data(tmp_path):
    """The rank files are saved with placeholders and filled in place; their id is then recomputed,
    and it is the one torch's writer gives the same records: each file is byte for byte what
    torch's writer makes of its records."""
    execute_convert(plan_convert(HF, tmp_path / "mcore", to="mcore", ckpt_format="torch", tp=2))
    ranks = sorted((tmp_path / "mcore").rglob("model_optim_rng.pt"))
    assert len(ranks) == 2
    for rank in ranks:
        again = _rewritten_by_torch(rank, tmp_path / "again" / rank.parent.name / rank.name)
        assert _records(again)[".data/serialization_id"] == _records(rank)[".data/serialization_id"]
        assert again == rank.read_bytes()
        torch.load(rank, weights_only=False)


def test_dcp_save_id_follows_the_tensor_bytes(tmp_path):
    """Two torch_dist converts whose sources differ in one tensor byte get different ``save_id``s
    (each a uuid), while their ``.metadata`` are otherwise the same."""
    import uuid

    from torch.distributed.checkpoint import FileSystemReader

    changed = tmp_path / "changed"
    shutil.copytree(HF, changed)
    data = bytearray((changed / "model.safetensors").read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    (changed / "model.safetensors").write_bytes(data)
    ids, files = [], []
    for name, src in (("a", HF), ("b", changed)):
        out = tmp_path / name
        execute_convert(plan_convert(src, out, to="mcore"))
        files.append(tree_digests(out))
        (metadata,) = out.rglob(".metadata")
        ids.append(FileSystemReader(str(metadata.parent)).read_metadata().storage_meta.save_id)
        assert uuid.UUID(ids[-1]).version == 5
    assert ids[0] != ids[1]
    differing = {k for k in files[0] if files[0][k] != files[1][k]}
    assert "iter_0000000/.metadata" in differing and "iter_0000000/common.pt" not in differing


@pytest.mark.parametrize("data", [b"PK\x07\x08abcdefgh", b"PK\x07\x08abc", b"PK\x07\x08"])
def test_container_id_counts_data_that_looks_like_a_descriptor_as_torch_does(tmp_path, data):
    """torch's writer takes a CRC from any buffer of 8+ bytes that starts with the data-descriptor
    signature, record data included; the id here follows it there too."""
    from ckptscope.formats.torch_save.zip_container import write_torch_save

    path = tmp_path / "archive"
    torch.save([torch.tensor(list(data), dtype=torch.uint8)], path)
    parsed = _records(path.read_bytes())
    ours = io.BytesIO()
    write_torch_save(ours.write, parsed["data.pkl"], [("0", parsed["data/0"], None)])
    assert ours.getvalue() == path.read_bytes()
