"""convert / merge / diff / verify on several processes and "nodes" under torchrun (issue 18).

A Llama-shaped checkpoint of about 155 MB (bf16, written with safetensors) is converted by one
process, by ``torchrun --standalone --nproc-per-node 2``, by ``--workers 2`` and by two torchrun
invocations that rendezvous on loopback as two nodes (``--nnodes 2 --node-rank 0/1``). Every output
file must hash the same (each run writes to the same destination path: torch_dist's ``.metadata``
records it). Diff and verify must print the same JSON and exit with the same code. A failure
injected on one tensor (``CKPTSCOPE_FAIL_ON_TENSOR``, tests only) must stop every rank with one line
naming the rank and the tensor and leave nothing behind; the same command then succeeds. Each rank
reports its peak RSS (``CKPTSCOPE_RSS_DIR``), which must stay within the largest tensor + 300 MB.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ckptscope.ops.parallel.launch import strip_workers
from ckptscope.ops.parallel.partition import assign
from tests.conftest import REPO

torch = pytest.importorskip("torch")

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 1024, 2816, 4, 16, 4, 16000
LARGEST = VOCAB * HIDDEN * 2  # embed_tokens / lm_head, bf16
RSS_SLACK = 300 * 1000**2


def write_llama(out: Path, seed: int, perturb: str | None = None) -> Path:
    """An HF Llama checkpoint (safetensors + config.json) with random bf16 weights."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    head = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
              "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                       p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                       p + "self_attn.k_proj.weight": (KV_HEADS * head, HIDDEN),
                       p + "self_attn.v_proj.weight": (KV_HEADS * head, HIDDEN),
                       p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                       p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
                       p + "mlp.down_proj.weight": (HIDDEN, FFN)})
    tensors = {name: torch.randn(shape, generator=gen).to(torch.bfloat16) for name, shape in shapes.items()}
    if perturb:
        tensors[perturb][0, :3] += 1
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": head, "vocab_size": VOCAB, "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torchrun")
    write_llama(root / "hf", seed=0)
    write_llama(root / "hf_b", seed=0, perturb="model.layers.1.mlp.down_proj.weight")
    return root


_SCRATCH: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def scratch_tmpdir(tmp_path_factory) -> None:
    """torchrun's agent leaves a /tmp/torchelastic_* directory behind per run (ckptscope's own
    ``--workers`` removes its one): the commands run here get a TMPDIR that pytest cleans up."""
    _SCRATCH["TMPDIR"] = str(tmp_path_factory.mktemp("tmpdir"))


def env(**extra: str) -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **_SCRATCH, **extra}
    out.pop("CKPTSCOPE_FAIL_ON_TENSOR", None)
    out.update(extra)
    return out


def one(args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptscope", *args], capture_output=True, text=True,
                          env=env(**extra), timeout=300, cwd=REPO)


def standalone(args: list[str], **extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ckptscope", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(**extra), timeout=300, cwd=REPO)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(args: list[str], **extra: str) -> list[subprocess.CompletedProcess]:
    """Two torchrun invocations, one process each, meeting on loopback as nodes 0 and 1."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "-m", "ckptscope", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(**extra), cwd=REPO)
             for rank in (0, 1)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def written(run, dst: Path, check=None) -> dict[str, str]:
    """Run ``run()`` into ``dst`` (removed first), ``check(dst)``, return its file digests, remove it again."""
    shutil.rmtree(dst, ignore_errors=True)
    results = run()
    for result in results if isinstance(results, list) else [results]:
        assert result.returncode == 0, result.stderr[-3000:]
    out = digests(dst)
    assert out
    if check:
        check(dst)
    shutil.rmtree(dst)
    return out


def loads_with_torch_dcp(hf: Path):
    """torch's own DCP reader (no process group) gives back the HF tensors (embedding, a layer of
    the stacked q projection rows) from the torch_dist save."""
    def check(root: Path) -> None:
        from safetensors.torch import load_file
        from torch.distributed.checkpoint import FileSystemReader, load

        iter_dir = root / "iter_0000000"
        md = FileSystemReader(str(iter_dir)).read_metadata()
        keys = ("embedding.word_embeddings.weight", "decoder.layers.mlp.linear_fc2.weight")
        stored = {k: torch.empty(tuple(md.state_dict_metadata[k].size), dtype=md.state_dict_metadata[k].properties.dtype)
                  for k in keys}
        load(stored, checkpoint_id=str(iter_dir), no_dist=True)
        source = load_file(str(hf / "model.safetensors"))
        assert torch.equal(stored[keys[0]], source["model.embed_tokens.weight"])
        for i in range(LAYERS):
            assert torch.equal(stored[keys[1]][i], source[f"model.layers.{i}.mlp.down_proj.weight"])

    return check


def loads_with_transformers(hf: Path):
    """transformers loads the merged shards with nothing missing or unexpected, equal to the source."""
    def check(root: Path) -> None:
        transformers = pytest.importorskip("transformers")
        from safetensors.torch import load_file

        model, info = transformers.AutoModelForCausalLM.from_pretrained(str(root), output_loading_info=True,
                                                                       torch_dtype=torch.bfloat16)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        source = load_file(str(hf / "model.safetensors"))
        state = model.state_dict()
        assert all(torch.equal(state[name], value) for name, value in source.items())

    return check


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.") or p.name == name)


def rss_ok(rss_dir: Path, ranks: int) -> None:
    reports = [json.loads(p.read_text()) for p in sorted(rss_dir.glob("rank*.json"))]
    assert len(reports) == ranks, reports
    for report in reports:
        assert report["max_rss_bytes"] <= LARGEST + RSS_SLACK, report


def test_partition_is_balanced_and_deterministic():
    sizes = {"c": 5, "a": 5, "b": 9, "d": 1, "e": 4}
    assert assign(sizes, 2) == [["b", "e"], ["c", "a", "d"]]  # loads 13 and 11; equal sizes by name
    assert [set(r) for r in assign(dict(reversed(sizes.items())), 2)] == [{"b", "e"}, {"a", "c", "d"}]
    assert sorted(sum(assign(sizes, 3), [])) == sorted(sizes)
    assert assign(sizes, 1) == [list(sizes)]
    assert strip_workers(["diff", "a", "--workers", "2", "b", "--workers=3", "--json"]) == ["diff", "a", "b", "--json"]


def test_torch_dist_same_bytes_on_one_two_ranks_and_two_nodes(work):
    """HF -> torch_dist with 4 data files: one process, 2 ranks, 2 "nodes" write the same bytes;
    each rank stays within the largest tensor + 300 MB."""
    dst = work / "mcore"
    args = ["convert", str(work / "hf"), str(dst), "--to", "mcore", "--num-files", "4"]
    reference = written(lambda: one(args), dst)
    assert {".metadata", "__0_3.distcp", "metadata.json"} <= {Path(f).name for f in reference}
    rss = work / "rss_standalone"
    rss.mkdir()
    assert written(lambda: standalone(args, CKPTSCOPE_RSS_DIR=str(rss)), dst) == reference
    rss_ok(rss, 2)
    rss = work / "rss_nodes"
    rss.mkdir()
    assert written(lambda: two_nodes(args, CKPTSCOPE_RSS_DIR=str(rss)), dst, loads_with_torch_dcp(work / "hf")) == reference
    rss_ok(rss, 2)


def test_legacy_tp2_and_merge_back(work):
    """HF -> legacy TP2 files, and that back to sharded HF: 2 ranks write what one process writes
    (neither format records its own path, so each run has its own destination)."""
    def convert(dst: Path) -> list[str]:
        return ["convert", str(work / "hf"), str(dst), "--to", "mcore", "--ckpt-format", "torch", "--tp", "2"]

    legacy = work / "legacy"
    assert one(convert(legacy)).returncode == 0  # kept as the merge's source
    reference = digests(legacy)
    assert sum(f.endswith("model_optim_rng.pt") for f in reference) == 2
    assert written(lambda: standalone(convert(work / "legacy_2")), work / "legacy_2") == reference

    def merge(dst: Path) -> list[str]:
        return ["merge", str(legacy), str(dst), "--max-shard-size", "40MB"]

    reference = written(lambda: one(merge(work / "merged")), work / "merged")
    assert "model.safetensors.index.json" in reference and len(reference) > 4
    assert written(lambda: standalone(merge(work / "merged_2")), work / "merged_2",
                   loads_with_transformers(work / "hf")) == reference


def test_diff_prints_the_same_json_and_exit_code(work):
    for other, code in ((work / "hf", 0), (work / "hf_b", 1)):
        args = ["diff", str(work / "hf"), str(other), "--json", "--map", "none"]
        alone = one(args)
        assert alone.returncode == code, alone.stderr
        shared = one([*args, "--workers", "2"])
        assert (shared.returncode, shared.stdout) == (code, alone.stdout), shared.stderr[-2000:]
    nodes = two_nodes(args)  # torchrun itself: rank 0 prints, every rank exits 1
    assert nodes[0].stdout == alone.stdout and not nodes[1].stdout
    assert all(r.returncode != 0 for r in nodes)


def test_verify_on_two_ranks(work):
    args = ["verify", str(work / "hf"), "--json"]
    alone = one(args)
    assert alone.returncode == 0, alone.stderr
    before = set(os.listdir(_SCRATCH["TMPDIR"]))
    shared = one([*args, "--workers", "2"])
    assert (shared.returncode, shared.stdout) == (0, alone.stdout), shared.stderr[-2000:]
    assert set(os.listdir(_SCRATCH["TMPDIR"])) == before  # no torchrun log directory left in TMPDIR


def test_failure_stops_every_rank_and_leaves_nothing(work):
    dst = work / "mcore_fail"
    args = ["convert", str(work / "hf"), str(dst), "--to", "mcore", "--num-files", "4"]
    failing = "decoder.layers.2.mlp.linear_fc2.weight"
    nodes = two_nodes(args, CKPTSCOPE_FAIL_ON_TENSOR=failing)
    assert all(r.returncode != 0 for r in nodes)
    lines = [line for r in nodes for line in r.stderr.splitlines() if line.startswith("ckptscope: error:")]
    assert lines, [r.stderr[-2000:] for r in nodes]
    assert all(f"tensor {failing}: failure injected" in line and "rank " in line for line in lines), lines
    assert leftovers(work, dst.name) == []
    shared = one([*args, "--workers", "2"], CKPTSCOPE_FAIL_ON_TENSOR=failing)
    assert shared.returncode == 2
    assert [line for line in shared.stderr.splitlines() if line.startswith("ckptscope: error:")]
    assert leftovers(work, dst.name) == []
    rerun = one([*args, "--workers", "2"])
    assert rerun.returncode == 0, rerun.stderr
    assert leftovers(work, dst.name) == [dst.name]


def test_a_rank_that_dies_stops_the_others(work):
    """Node 1's rank is killed outright (SIGKILL) in the middle of its share: node 0's rank loses
    contact at its next collective, says so in one line, removes the staging dir and exits 2; a
    rerun writes what one process writes."""
    from ckptscope.ops.convert.hf_target import hf_shard_bytes
    from ckptscope.ops.convert.plan import plan_convert

    dst = work / "hf_kill"
    args = ["convert", str(work / "hf"), str(dst), "--to", "hf", "--max-shard-size", "40MB"]
    plan = plan_convert(work / "hf", dst, to="hf", max_shard_size="40MB")
    rank1 = assign(hf_shard_bytes(plan), 2)[1]
    victim = dict(plan.shards)[rank1[0]][-1]
    nodes = two_nodes(args, CKPTSCOPE_FAIL_ON_TENSOR=f"{victim}:kill", CKPTSCOPE_DIST_TIMEOUT="60")
    assert all(r.returncode != 0 for r in nodes)
    lines = [line for line in nodes[0].stderr.splitlines() if line.startswith("ckptscope: error:")]
    assert len(lines) == 1 and "rank 0: lost contact with the other ranks" in lines[0], nodes[0].stderr[-2000:]
    assert leftovers(work, dst.name) == []
    reference = written(lambda: one(args), dst)
    assert written(lambda: two_nodes(args), dst) == reference


def test_moe_legacy_tp2_ep2_same_bytes_on_two_ranks(tmp_path):
    """Expert-parallel rank files (TP 2 x EP 2, a Mixtral written by transformers' save_pretrained):
    2 ranks write exactly what one process writes."""
    samples = str(REPO / "sample_ckpts")
    if samples not in sys.path:
        sys.path.insert(0, samples)
    import make_moe_samples

    hf = make_moe_samples.write_hf_moe("mixtral", tmp_path)

    def convert(dst: Path) -> list[str]:
        return ["convert", str(hf), str(dst), "--to", "mcore", "--ckpt-format", "torch", "--tp", "2", "--ep", "2"]

    reference = written(lambda: one(convert(tmp_path / "ep1")), tmp_path / "ep1")
    assert sum("model_optim_rng.pt" in f for f in reference) == 4  # mp_rank_TT_EEE for TT, EEE in 0..1
    assert written(lambda: standalone(convert(tmp_path / "ep2")), tmp_path / "ep2") == reference
