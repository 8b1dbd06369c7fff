"""DeepSpeed ZeRO 1/2/3 save dirs, opened as the one fp32 model ``zero_to_fp32`` rebuilds.

Fixtures come from sample_ckpts/make_deepspeed_samples.py: real ``deepspeed.initialize`` +
``save_checkpoint`` on 2 gloo CPU ranks (bf16, odd param sizes so partitions need padding and a
param straddles the ZeRO-1/2 rank boundary). Ground truth is DeepSpeed's own
``get_fp32_state_dict_from_zero_checkpoint`` (written by the generator); for the Adam moments,
DeepSpeed's own ``zero_to_fp32`` merge functions fed the moments instead of the fp32 groups.
The saves and both oracles are shipped in ``sample_ckpts/deepspeed_zero`` (written by DeepSpeed
itself), so these tests run without DeepSpeed; the few that regenerate them need ``deepspeed`` (CPU
build, ``DS_BUILD_OPS=0``) and are skipped without it.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import run_cli
from dist_reference import SAMPLES, assert_no_torch_on_metadata_path

from ckptscope.core.errors import CkptError
from ckptscope.formats.deepspeed.reader import DeepSpeedReader, flat_range_boxes
from ckptscope.formats.registry import detect_format
from ckptscope.ops.opening import open_checkpoint

TAG = "global_step2"
STAGES = (1, 2, 3)


# --- the flat-range decomposition (pure, no DeepSpeed needed) --------------------------------------


@pytest.mark.parametrize("shape", [(), (7,), (5, 3), (4, 3, 5), (2, 1, 3, 4), (3, 0, 2)])
def test_flat_range_boxes_tile_the_range_with_contiguous_boxes(shape):
    numel = math.prod(shape)
    rng = np.random.default_rng(0)
    ranges = {(0, numel), (0, 0)}
    if numel:
        ranges |= {tuple(sorted(int(i) for i in rng.integers(0, numel + 1, 2))) for _ in range(60)}
    flat = np.arange(numel).reshape(shape)
    for start, stop in ranges:
        boxes = flat_range_boxes(shape, int(start), int(stop))
        assert len(boxes) <= max(1, 2 * len(shape) - 1)
        covered = []
        for offsets, box, first in boxes:
            part = flat[tuple(slice(o, o + s) for o, s in zip(offsets, box))]
            values = part.reshape(-1)
            assert values.size == math.prod(box) > 0
            assert values[0] == first
            assert np.array_equal(values, np.arange(first, first + values.size))  # contiguous in C order
            covered.extend(values.tolist())
        assert covered == list(range(start, stop))


# --- real DeepSpeed saves -------------------------------------------------------------------------


def ds_generators():
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_deepspeed_samples")


SHIPPED = SAMPLES / "deepspeed_zero"
"""ZeRO-1/2/3 saves written by DeepSpeed 0.19.8 itself (``make_deepspeed_samples.py``, 2 gloo CPU
ranks), with DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` result beside each as the
oracle. Shipped, so CI checks the reader against real DeepSpeed bytes without installing DeepSpeed
(its sdist builds against torch, which would pull another torch into pip's build environment).
DeepSpeed's helper scripts (``zero_to_fp32.py``) are left out: they are DeepSpeed's code, not data."""


@pytest.fixture(scope="module")
def saves(tmp_path_factory) -> dict[int, Path]:
    """A private copy of the shipped saves (some tests damage their copy)."""
    out = tmp_path_factory.mktemp("deepspeed")
    shutil.copytree(SHIPPED, out, dirs_exist_ok=True)
    return {stage: out / f"zero{stage}" for stage in STAGES}


def test_generator_writes_the_shipped_layout(tmp_path):
    """With DeepSpeed installed, the generator still writes what is shipped: the same files, and
    DeepSpeed's own oracle of a fresh save equals ours read from the fresh save."""
    pytest.importorskip("deepspeed")
    fresh = ds_generators().write_deepspeed_samples(tmp_path)
    for stage, save in fresh.items():
        names = sorted(p.relative_to(save).as_posix() for p in save.rglob("*") if p.is_file()
                       and not p.name.startswith("zero_to_"))
        shipped = sorted(p.relative_to(SHIPPED / f"zero{stage}").as_posix()
                         for p in (SHIPPED / f"zero{stage}").rglob("*") if p.is_file())
        assert names == shipped
        with open_checkpoint(save) as reader:
            assert_bitwise(reader, oracle(save))


def oracle(save_dir: Path) -> dict[str, np.ndarray]:
    import torch

    state = torch.load(ds_generators().oracle_path(save_dir), weights_only=True)
    return {k: as_numpy(v) for k, v in state.items()}


def as_numpy(tensor) -> np.ndarray:
    import torch

    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def assert_bitwise(reader, want: dict[str, np.ndarray]) -> None:
    for name, value in want.items():
        got = reader.read(name)
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name


@pytest.mark.parametrize("stage", STAGES)
def test_detected_and_inspect_json_lists_every_fp32_param(saves, stage):
    save_dir = saves[stage]
    assert detect_format(save_dir / TAG) is DeepSpeedReader
    assert detect_format(save_dir) is DeepSpeedReader  # the save dir, through `latest`
    want = oracle(save_dir)
    result = run_cli("inspect", str(save_dir / TAG), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["format"] == "deepspeed"
    assert report["metadata"]["deepspeed"]["zero_stage"] == stage
    assert report["metadata"]["deepspeed"]["world_size"] == 2
    assert report["metadata"]["warnings"] == []
    tensors = {t["name"]: t for t in report["tensors"]}
    for name, value in want.items():
        assert tensors[name]["shape"] == list(value.shape), name
        assert tensors[name]["dtype"] == str(value.dtype), name
        assert tensors[name]["role"] == "model", name
    trainable = [n for n, v in want.items() if v.dtype == np.float32]
    assert len(trainable) == 20
    for name in trainable:  # the moments are optimizer state
        for key in ("exp_avg", "exp_avg_sq"):
            assert tensors[f"optimizer.state.{key}.{name}"]["role"] == "optimizer"
            assert tensors[f"optimizer.state.{key}.{name}"]["shape"] == list(want[name].shape)
    roles = report["metadata"]["roles"]
    assert roles["unknown"] == [] and roles["naming"] == "hf"
    assert roles["model"]["tensors"] == 21  # 20 trained + the frozen layernorm
    if stage < 3:  # the module's bf16 copies: training state, not a second model
        assert tensors["lp_params.lm_head.weight"]["dtype"] == "bfloat16"
        assert tensors["lp_params.lm_head.weight"]["role"] == "optimizer"


@pytest.mark.parametrize("stage", STAGES)
def test_values_equal_deepspeeds_zero_to_fp32_bitwise(saves, stage):
    want = oracle(saves[stage])
    for path in (saves[stage] / TAG, saves[stage]):
        with open_checkpoint(path) as reader:
            assert_bitwise(reader, want)
            frozen = reader.read("model.layers.0.input_layernorm.weight")
            assert frozen.dtype.name == "bfloat16"  # frozen params keep their stored dtype, as zero_to_fp32
            if stage == 1:  # bf16 ZeRO-1 records no frozen params: zero_to_fp32 drops it, we keep the module's
                assert "model.layers.0.input_layernorm.weight" not in want


def test_a_param_straddles_the_zero2_rank_boundary_and_stage3_pads(saves):
    with open_checkpoint(saves[2] / TAG) as reader:
        for name in ("model.layers.1.self_attn.v_proj.weight", "model.embed_tokens.weight"):  # one per group
            assert len({c.file for c in reader.meta(name).chunks}) == 2, name
    with open_checkpoint(saves[3] / TAG) as reader:
        meta = reader.meta("model.embed_tokens.weight")  # 333 elements: 167 + 166 (one padding element)
        by_file: dict[str, int] = {}
        for c in meta.chunks:
            by_file[c.file] = by_file.get(c.file, 0) + math.prod(c.shape)
        assert sorted(by_file.values()) == [166, 167]


def _deepspeed_moments(save_dir: Path, stage: int, key: str) -> dict[str, np.ndarray]:
    """DeepSpeed's own zero_to_fp32 merge, fed each rank's ``key`` moment instead of its fp32 groups."""
    import torch
    from deepspeed.utils import zero_to_fp32 as z

    tag_dir = save_dir / TAG
    models = z.parse_model_states(z.get_model_state_files(str(tag_dir)))
    groups = []
    for file in z.get_optim_files(str(tag_dir)):
        osd = torch.load(file, weights_only=False)["optimizer_state_dict"]
        if stage < 3:
            fp32 = osd["single_partition_of_fp32_groups"]
            state = osd["base_optimizer_state"]["state"]
            groups.append([state[g][key][: fp32[g].numel()] for g in range(len(fp32))])
        else:
            state = osd["optimizer_state_dict"]["state"]
            groups.append([state[g][key] for g in range(len(osd["fp32_flat_groups"]))])
    out: dict = {}
    if stage < 3:
        paddings = torch.load(z.get_optim_files(str(tag_dir))[0], weights_only=False)["optimizer_state_dict"].get(
            "param_alignment_paddings")
        z._zero2_merge_trainable_params(out, len(groups), groups, models, paddings)
    else:
        z._zero3_merge_trainable_params(out, len(groups), groups, models)
    return {k: v.contiguous().numpy() for k, v in out.items()}


def shipped_moments(stage: int, key: str) -> dict[str, np.ndarray]:
    """DeepSpeed's merge of the shipped save's ``key`` moments, computed by ``_deepspeed_moments``
    with DeepSpeed 0.19.8 when the sample was written and shipped beside it."""
    import torch

    state = torch.load(SHIPPED / f"zero{stage}.moments_oracle.pt", weights_only=True)
    return {k[len(key) + 1:]: v.numpy() for k, v in state.items() if k.startswith(key + ".")}


@pytest.mark.parametrize("stage", STAGES)
def test_adam_moments_equal_deepspeeds_own_merge(saves, stage):
    with open_checkpoint(saves[stage] / TAG) as reader:
        for key in ("exp_avg", "exp_avg_sq"):
            want = shipped_moments(stage, key)
            assert len(want) == 20
            assert_bitwise(reader, {f"optimizer.state.{key}.{k}": v for k, v in want.items()})


@pytest.mark.parametrize("stage", STAGES)
def test_shipped_moment_oracle_is_deepspeeds_merge(stage):
    pytest.importorskip("deepspeed")
    for key in ("exp_avg", "exp_avg_sq"):
        fresh = _deepspeed_moments(SHIPPED / f"zero{stage}", stage, key)
        shipped = shipped_moments(stage, key)
        assert fresh.keys() == shipped.keys()
        assert all(fresh[k].tobytes() == shipped[k].tobytes() for k in fresh)


def test_byte_span_of_a_param_inside_one_rank(saves):
    with open_checkpoint(saves[2] / TAG) as reader:
        name = "model.layers.0.self_attn.q_proj.weight"  # first in group 0: wholly in rank 0's partition
        span = reader.byte_span(name)
        assert span is not None
        path, offset, length = span
        with open(path, "rb") as handle:
            handle.seek(offset)
            assert handle.read(length) == reader.read(name).tobytes()


def test_indexing_and_reading_import_no_torch(saves):
    for stage in STAGES:
        assert_no_torch_on_metadata_path(saves[stage] / TAG, read="model.embed_tokens.weight")


def test_missing_rank_file_is_reported_not_a_traceback(saves, tmp_path):
    broken = tmp_path / "zero2"
    shutil.copytree(saves[2], broken)
    gone = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    (broken / TAG / gone).unlink()

    check = run_cli("check", str(broken / TAG))
    assert check.code != 0
    assert gone in check.out + check.err
    assert "Traceback" not in check.err

    inspect = run_cli("inspect", str(broken / TAG))
    assert inspect.code == 0, inspect.err
    assert gone in inspect.out + inspect.err
    assert "Traceback" not in inspect.err

    want = oracle(saves[2])
    with open_checkpoint(broken / TAG) as reader:
        assert reader.index().issues and reader.index().issues[0].kind == "missing-file"
        first = "model.layers.0.self_attn.q_proj.weight"
        assert_bitwise(reader, {first: want[first]})  # rank 0 only
        with pytest.raises(CkptError, match=gone):
            reader.read("lm_head.weight")  # the last param: rank 1 only
        # the straddling param: rank 0's rows read, rank 1's refuse
        q = "model.layers.1.self_attn.v_proj.weight"
        assert reader.read(q, (slice(0, 1),)).tobytes() == want[q][:1].tobytes()
        with pytest.raises(CkptError, match=gone):
            reader.read(q)


@pytest.mark.parametrize("stage", (2, 3))
def test_merge_to_hf_loads_with_from_pretrained(saves, stage, tmp_path):
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    result = run_cli("merge", str(saves[stage]), str(out), "--hf-config", str(saves[stage].parent / "hf_config"))
    assert result.code == 0, result.err
    want = oracle(saves[stage])
    stored = load_file(str(out / "model.safetensors"))
    assert set(stored) == set(want)
    for name, value in want.items():
        got = stored[name]
        assert got.dtype == value.dtype and got.tobytes() == value.tobytes(), name
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    for name, param in model.state_dict().items():
        assert np.array_equal(param.numpy(), want[name].astype(np.float32)), name


def test_model_states_only_is_the_model(saves, tmp_path):
    """Without optim files a ZeRO-1/2 tag dir shows the module's bf16 weights as the model."""
    only = tmp_path / TAG
    only.mkdir()
    shutil.copy(saves[2] / TAG / "mp_rank_00_model_states.pt", only)
    with open_checkpoint(only) as reader:
        index = reader.index()
        assert index.tensors["lm_head.weight"].dtype == "bfloat16"
        assert not any(n.startswith(("lp_params.", "optimizer.state.")) for n in index.tensors)
    result = subprocess.run([sys.executable, "-m", "ckptscope", "inspect", str(only)], capture_output=True, text=True)
    assert result.returncode == 0 and "Traceback" not in result.stderr


# --- without DeepSpeed: the layout as DeepSpeed's source writes it, torch.save only ----------------
#
# Runs where deepspeed is not installed (CI). Stage 1/2 (``stage_1_and_2.py`` ``state_dict``): one
# flat fp32 vector per group, padded to a multiple of 2 * world size, cut in equal partitions, the
# last one saved without its padding (``group_paddings``); stage 3 (``stage3.py``): every param
# padded to a multiple of the world size, rank r's ``fp32_flat_groups`` = its slice of each param.
# The oracle is the fp32 params themselves, not anything the reader computes.

SYNTH_SHAPES = {"embed.weight": (7, 5), "block.w": (3, 4, 5), "block.b": (11,), "head.weight": (5, 7)}


def write_synthetic(out: Path, stage: int, world: int) -> dict[str, np.ndarray]:
    import torch
    from collections import OrderedDict

    gen = torch.Generator().manual_seed(stage * 10 + world)
    params = {k: torch.randn(s, generator=gen) for k, s in SYNTH_SHAPES.items()}
    buffer = torch.arange(6, dtype=torch.bfloat16)
    tag = out / "global_step5"
    tag.mkdir(parents=True)
    (out / "latest").write_text("global_step5")
    module = OrderedDict((k, v.to(torch.bfloat16)) for k, v in params.items())
    module["running"] = buffer
    module["tied.weight"] = module["head.weight"]
    model_states = {"module": module, "buffer_names": ["running"], "optimizer": None,
                    "param_shapes": [OrderedDict((k, torch.Size(s)) for k, s in SYNTH_SHAPES.items())],
                    "frozen_param_shapes": None, "frozen_param_fragments": None,
                    "shared_params": {"tied.weight": "head.weight"}, "global_steps": 5, "dp_world_size": world,
                    "ds_config": {"zero_optimization": {"stage": stage}}, "ds_version": "synthetic"}
    flats = []
    if stage < 3:
        flat = torch.cat([p.reshape(-1) for p in params.values()])
        padded = math.ceil(flat.numel() / (2 * world)) * 2 * world
        flat = torch.cat([flat, torch.zeros(padded - flat.numel())])
        part = padded // world
        pad = padded - sum(p.numel() for p in params.values())
        for r in range(world):
            lean = part - (pad if r == world - 1 else 0)
            flats.append(flat[r * part:r * part + lean].clone())
    else:
        for r in range(world):
            pieces = []
            for p in params.values():
                n = p.numel()
                size = math.ceil(n / world)
                padded = torch.cat([p.reshape(-1), torch.zeros(size * world - n)])
                pieces.append(padded[r * size:(r + 1) * size])
            flats.append(torch.cat(pieces))
    for r in range(world):
        name = f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
        if stage == 3 or r == 0:
            torch.save(model_states if stage < 3 else {**model_states, "module": OrderedDict(
                (k, torch.empty(0, dtype=torch.bfloat16) if k in params else v) for k, v in module.items())},
                tag / name)
        moments = {"step": torch.tensor(5.0), "exp_avg": flats[r] * 2, "exp_avg_sq": flats[r] * 3}
        if stage < 3:
            osd = {"zero_stage": stage, "partition_count": [world], "single_partition_of_fp32_groups": [flats[r]],
                   "group_paddings": [pad if r == world - 1 else 0],
                   "base_optimizer_state": {"state": {0: moments}, "param_groups": [{"lr": 0.1, "params": [0]}]}}
        else:
            osd = {"zero_stage": 3, "partition_count": world, "fp32_flat_groups": [flats[r]],
                   "optimizer_state_dict": {"state": {0: moments}, "param_groups": [{"lr": 0.1, "params": [0]}]}}
        torch.save({"optimizer_state_dict": osd, "ds_version": "synthetic"},
                   tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    want = {k: v.numpy() for k, v in params.items()}
    want["tied.weight"] = want["head.weight"]
    want["running"] = buffer.float().numpy()  # zero_to_fp32 reads floating buffers as float32
    return want


@pytest.mark.parametrize("stage,world", [(2, 2), (2, 3), (1, 4), (3, 2), (3, 3)])
def test_synthetic_layout_without_deepspeed(tmp_path, stage, world):
    pytest.importorskip("torch")
    want = write_synthetic(tmp_path / "save", stage, world)
    with open_checkpoint(tmp_path / "save") as reader:
        index = reader.index()
        assert index.format == "deepspeed" and not index.warnings
        assert index.metadata["deepspeed"]["zero_stage"] == stage
        assert_bitwise(reader, want)
        for key, factor in (("exp_avg", 2), ("exp_avg_sq", 3)):
            assert_bitwise(reader, {f"optimizer.state.{key}.{k}": (want[k] * np.float32(factor))
                                    for k in SYNTH_SHAPES})
        # a region across partitions reads the same as slicing the whole
        box = (slice(1, 3), slice(2, 4), slice(1, 5))
        assert reader.read("block.w", box).tobytes() == want["block.w"][1:3, 2:4, 1:5].tobytes()
        assert reader.byte_span("running") is None  # stored as bf16, read as float32


# --- universal checkpoints (ds_to_universal) ---------------------------------------------------------


def universal(stage: int) -> Path:
    """``ds_to_universal`` of the shipped ``zero{stage}`` save, written by DeepSpeed 0.19.8 itself
    (``make_deepspeed_samples.write_universal_samples``) and shipped beside it."""
    return SHIPPED / f"universal_zero{stage}"


@pytest.mark.parametrize("stage", STAGES)
def test_universal_checkpoint_is_its_fp32_masters(stage, tmp_path):
    """Before, the model-states file's bf16 module copy was shown (and merged) as the model and the
    ``zero/`` tree ignored: values off by bf16 rounding, no warning. The fp32 masters in
    ``zero/<param>/fp32.pt`` are DeepSpeed's ``zero_to_fp32`` result of the save converted, bit for bit;
    the moments are DeepSpeed's own merge of them."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    root = universal(stage)
    want = {k: v for k, v in oracle(SHIPPED / f"zero{stage}").items() if v.dtype == np.float32}
    for path in (root, root / f"{TAG}_universal"):  # the root through latest_universal, or the tag dir
        assert detect_format(path) is DeepSpeedReader
        with open_checkpoint(path) as reader:
            index = reader.index()
            assert index.metadata["deepspeed"]["universal"] and not index.issues
            # the run's ds_config says the stage (a ZeRO-1 run was labelled ZeRO-2: a newcomer's probe)
            assert index.metadata["deepspeed"]["zero_stage"] == stage
            assert_bitwise(reader, want)
            for key in ("exp_avg", "exp_avg_sq"):
                assert_bitwise(reader, {f"optimizer.state.{key}.{k}": v for k, v in shipped_moments(stage, key).items()})
    out = tmp_path / "hf"
    result = run_cli("merge", str(root), str(out), "--hf-config", str(SHIPPED / "hf_config"))
    assert result.code == 0, result.err
    stored = load_file(str(out / "model.safetensors"))
    for name, value in want.items():
        assert stored[name].dtype == np.float32 and stored[name].tobytes() == value.tobytes(), name
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_universal_checkpoint_missing_a_master_is_damaged(tmp_path):
    root = tmp_path / "u"
    shutil.copytree(universal(2), root)
    shutil.rmtree(root / f"{TAG}_universal" / "zero" / "lm_head.weight")
    result = run_cli("check", str(root))
    assert result.code == 1 and "lm_head.weight/fp32.pt" in result.out + result.err
    result = run_cli("merge", str(root), str(tmp_path / "hf"), "--hf-config", str(SHIPPED / "hf_config"))
    assert result.code == 2 and not (tmp_path / "hf").exists(), result.err


def test_generator_writes_the_shipped_universal_layout(tmp_path):
    pytest.importorskip("deepspeed")
    shutil.copytree(SHIPPED, tmp_path, dirs_exist_ok=True)
    for path in tmp_path.glob("universal_zero*"):
        shutil.rmtree(path)
    for stage, root in ds_generators().write_universal_samples(tmp_path).items():
        fresh = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        shipped = sorted(p.relative_to(universal(stage)).as_posix() for p in universal(stage).rglob("*") if p.is_file())
        assert fresh == shipped


# --- pipeline saves: assembled; tensor-parallel and MoE saves: not assembled, and said so ----------------


@pytest.mark.parametrize("name, tag, files", [
    ("pipeline_tp2", "global_step2", ["layer_03-model_01-model_states.pt", "layer_03-model_00-model_states.pt",
                                      "mp_rank_01_model_states.pt"]),
])
def test_tensor_parallel_and_moe_saves_are_flagged_and_not_exported(name, tag, files, tmp_path):
    """A PipelineModule on a topology with a model axis (pp=1 x tp=2, Megatron-DeepSpeed's naming
    ``layer_NN-model_TT-model_states.pt``), written by DeepSpeed's engine
    (``make_deepspeed_samples.write_pipeline_and_moe_samples``, shipped). Its tensor-parallel ranks are
    not assembled: check fails naming each file, inspect warns, exports refuse. (Before, ``-model_00-``
    layer files matched no pattern and were ignored without a word. MoE saves are assembled:
    tests/test_deepspeed_moe.py, which also has an expert file of another TP rank, flagged.)"""
    save = SHIPPED / name
    result = run_cli("check", str(save))
    assert result.code == 1, result.out + result.err
    for file in files:
        assert f"unassembled-file: {tag}/{file}" in result.out, result.out
    result = run_cli("inspect", "--json", str(save))
    assert result.code == 0 and any("not assembled" in w for w in json.loads(result.out)["metadata"]["warnings"])
    result = run_cli("merge", str(save), str(tmp_path / "hf"), "--hf-config", str(SHIPPED / "hf_config"))
    assert result.code == 2 and "not assembled" in result.err and not (tmp_path / "hf").exists(), result.err


def _pipeline_oracle(name: str) -> dict:
    """DeepSpeed's engine after the save (``make_deepspeed_samples.pipeline_oracle_path``): each stage's
    ``safe_get_full_fp32_param`` and ``module.state_dict()``, as plain numpy arrays."""
    import torch

    loaded = torch.load(str(SHIPPED / f"{name}.oracle.pt"), weights_only=True)
    return {kind: {n: t.float().numpy() for n, t in tensors.items()} for kind, tensors in loaded.items()}


@pytest.mark.parametrize("save, stage_text", [("pipeline_zero1", "ZeRO-1"),
                                              ("pipeline_bf16_zero0", "ZeRO-0, BF16_Optimizer"),
                                              ("pipeline_bf16_zero0_dp2", "ZeRO-0, BF16_Optimizer"),
                                              ("pipeline_bf16_zero1_acc32_dp2", "ZeRO-1, BF16_Optimizer"),
                                              ("pipeline_bf16_zero0_tiedshape", "ZeRO-0, BF16_Optimizer"),
                                              ("pipeline_bf16_zero1_one_stage", "ZeRO-1, pipeline of 1 stage")])
def test_pipeline_save_reads_every_stage_masters_and_layer_files_bitwise(save, stage_text):
    """``PipelineModule`` in 2 stages (shipped, written by DeepSpeed 0.19.8): each stage has its own
    ``mp_rank_0S`` model states (no ``module``) and optim file, and every layer its own
    ``layer_NN-model_states.pt``. The model is every stage's fp32 masters under the module's names,
    bitwise what DeepSpeed's ``safe_get_full_fp32_param`` returns; the layer files' bf16 weights are the
    ``lp_params.`` copies, bitwise the engine's ``module.state_dict()``. The tied module (first layer of
    stage 0, last of stage 1) is one master. Before, only stage 0's masters were shown and check failed.
    bf16 at ZeRO-0 (Megatron-DeepSpeed's usual setup) runs DeepSpeed's BF16_Optimizer, which records
    neither a zero_stage nor param shapes (only ``param_slice_mappings``): it was refused ("unknown
    zero_stage None")."""
    oracle = _pipeline_oracle(save)
    with open_checkpoint(SHIPPED / save) as reader:
        index = reader.index()
        model = {n for n, t in index.tensors.items() if t.attr("zero") is not None}
        assert model == set(oracle["fp32"]) and "tied_modules.tie.weight" in model
        for name, want in oracle["fp32"].items():
            assert np.array_equal(np.asarray(reader.read(name)), want), name
        for name, want in oracle["module"].items():
            got = np.asarray(reader.read("lp_params." + name)).astype(np.float32)
            assert index.tensors["lp_params." + name].dtype == "bfloat16" and np.array_equal(got, want), name
        assert not index.issues and not index.warnings
        assert index.metadata["deepspeed"]["pipeline_stages"] == (1 if "one_stage" in save else 2)
    result = run_cli("check", str(SHIPPED / save))
    assert result.code == 0, result.out + result.err
    doc = json.loads(run_cli("inspect", "--json", str(SHIPPED / save)).out)
    assert doc["metadata"]["num_params"] == sum(v.size for v in oracle["fp32"].values())
    assert f"DeepSpeed ZeRO save ({stage_text}" in doc["iteration_layout"] and "pipeline of" in doc["iteration_layout"]


def test_pipeline_save_without_masters_is_its_layer_files():
    """fp32 ZeRO-0 keeps no masters apart: the layer files are the model, bitwise the engine's params.
    Nothing in this save names the tied module, so it shows under both layers that hold it (0 and 5),
    each equal to the engine's ``tied_modules.tie.weight``; each stage's client-optimizer state (both
    number their params from 0) keeps its own name."""
    oracle = _pipeline_oracle("pipeline_zero0_fp32")["fp32"]
    with open_checkpoint(SHIPPED / "pipeline_zero0_fp32") as reader:
        index = reader.index()
        want = {("0.weight" if n.startswith("tied_modules.") else n): v for n, v in oracle.items()}
        want["5.weight"] = oracle["tied_modules.tie.weight"]
        model = {n for n in index.tensors if not n.startswith("optimizer.")}
        assert model == set(want)
        for name, value in want.items():
            assert np.array_equal(np.asarray(reader.read(name)), value), name
        assert index.tensors["optimizer.state.0.exp_avg"].shape == (6, 6)
        assert index.tensors["optimizer.stage_1.state.1.exp_avg"].shape == (6, 10)  # stage 1's 3.weight
        assert not index.issues


def test_a_frozen_layer_shaped_like_the_tied_module_is_told_apart(tmp_path):
    """A frozen ``Linear(6, 6)`` (layer 1, not in the optimizer) looks like the tied ``Linear(6, 6)``: nothing in
    the save says which layer files hold the tied module. A reviewer found the frozen layer taken for it and gone
    from the model, check ok. The tied module's copies are one module saved by each stage, kept equal by
    DeepSpeed, so byte for byte equal; the frozen layer is not: it keeps its layer name (bitwise the engine's)
    and the tied module gets its bf16 copy. When no group of equal copies stands out, a warning says the
    copies were not picked among (the fixture's frozen layer is then made equal to no other)."""
    oracle = _pipeline_oracle("pipeline_bf16_zero1_frozen")
    with open_checkpoint(SHIPPED / "pipeline_bf16_zero1_frozen") as reader:
        index = reader.index()
        assert np.array_equal(np.asarray(reader.read("1.weight")).astype(np.float32), oracle["module"]["1.weight"])
        assert np.array_equal(np.asarray(reader.read("tied_modules.tie.weight")), oracle["fp32"]["tied_modules.tie.weight"])
        lp = np.asarray(reader.read("lp_params.tied_modules.tie.weight")).astype(np.float32)
        assert np.array_equal(lp, oracle["module"]["tied_modules.tie.weight"])
        for name in ("3.weight", "3.bias", "4.weight", "4.bias"):
            assert np.array_equal(np.asarray(reader.read(name)), oracle["fp32"][name]), name
        assert not index.issues and not index.warnings
        assert index.tensors["1.weight"].attr("frozen") is not None
    # the tied copy on stage 1 changed: three look-alikes, no two equal: none is picked, and it is said
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "pipeline_bf16_zero1_frozen", save)
    layer5 = save / "global_step2" / "layer_05-model_states.pt"
    import torch

    state = torch.load(str(layer5), weights_only=True)
    torch.save({k: v + 1 for k, v in state.items()}, str(layer5))
    with open_checkpoint(save) as reader:
        index = reader.index()
        assert any("look like tied module 'tie'" in w for w in index.warnings), index.warnings
        assert "1.weight" in index.tensors and not index.issues


@pytest.mark.parametrize("save", ["pipeline_zero1", "pipeline_bf16_zero0"])
@pytest.mark.parametrize("lost, said", [
    ("*mp_rank_01_*", "pipeline stage 1 of 2 has no rank files"),
    ("*optim_states.pt", "optimizer file (the other stages have theirs)"),
])
def test_a_pipeline_save_missing_a_stage_or_its_optimizer_is_damage(tmp_path, save, lost, said):
    """A probe deleted the last stage's files, or one stage's optimizer file: check said ok and the layer files'
    bf16 copies stood in for the lost fp32 masters. The save records its stage count
    (``checkpoint_parallel_dimensions``, ``mp_world_size``) and the other stages' optimizer files: both
    are ``missing-file`` now, and exports refuse."""
    root = tmp_path / "save"
    shutil.copytree(SHIPPED / save, root)
    pattern = lost if "mp_rank" in lost else "*mp_rank_01_optim_states.pt"
    removed = [p for p in (root / "global_step2").glob(pattern)]
    assert removed
    for path in removed:
        path.unlink()
    result = run_cli("check", str(root))
    assert result.code == 1 and "missing-file" in result.out and said in result.out, result.out


@pytest.mark.parametrize("stage", [0, 1])
def test_a_pipeline_stage_missing_only_its_model_states_is_listed(tmp_path, stage):
    """One stage's model-states file gone, its optimizer file still there: every command, check included,
    stopped with one error line (exit 2) because that file has the param shapes. check now lists it
    (exit 1) beside what the other stages hold, and convert refuses the damaged save."""
    root = tmp_path / "save"
    shutil.copytree(SHIPPED / "pipeline_zero1", root)
    (root / "global_step2" / f"mp_rank_{stage:02d}_model_states.pt").unlink()
    result = run_cli("check", str(root / "global_step2"))
    assert result.code == 1, result.err
    problems = [line for line in result.out.splitlines() if line.startswith("missing-file")]
    assert len(problems) == 1 and f"mp_rank_{stage:02d}_model_states.pt" in problems[0], result.out
    assert f"pipeline stage {stage}'s model-states file" in problems[0]
    converted = run_cli("convert", str(root / "global_step2"), "--to", "hf", str(tmp_path / "out"))
    assert converted.code == 2 and "damaged" in converted.err and not (tmp_path / "out").exists(), converted.err
    for path in (root / "global_step2").glob("mp_rank_*_model_states.pt"):  # none left: the one-line error
        path.unlink()
    result = run_cli("check", str(root / "global_step2"))
    assert result.code == 2 and "model_states.pt" in result.err and "Traceback" not in result.err, result.err


def test_pipeline_save_missing_a_layer_file_is_damage(tmp_path):
    """A deleted layer file takes the module copies of its params: check names them (before, pipeline saves
    were only ever 'not assembled')."""
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "pipeline_zero1", save)
    (save / "global_step2" / "layer_03-model_states.pt").unlink()
    result = run_cli("check", str(save))
    assert result.code == 1 and "missing-file" in result.out and "3.weight" in result.out, result.out


def test_pipeline_iterations_diff_by_their_training_step():
    """The two saves of the run (global_step1, global_step2) diff as the same module names, every
    trained param changed by the step between them."""
    result = run_cli("diff", "--json", str(SHIPPED / "pipeline_zero1" / "global_step1"),
                     str(SHIPPED / "pipeline_zero1" / "global_step2"))
    assert result.code == 1, result.err
    summary = json.loads(result.out)["summary"]
    assert summary["different"] == 7 and not summary["only_a"] and not summary["only_b"], summary


def test_generator_writes_the_shipped_pipeline_and_moe_layouts(tmp_path):
    pytest.importorskip("deepspeed")
    for fresh in ds_generators().write_pipeline_and_moe_samples(tmp_path):
        names = sorted(p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file())
        shipped = sorted(p.relative_to(SHIPPED / fresh.name).as_posix() for p in (SHIPPED / fresh.name).rglob("*")
                         if p.is_file())
        assert names == shipped


@pytest.mark.parametrize("source", ["trainer_zero3", "trainer_zero3/checkpoint-2", "trainer_zero3/checkpoint-2/global_step2"])
def test_trainer_zero3_checkpoint_converts_with_the_config_beside_it(source, tmp_path):
    """The transformers Trainer under ZeRO-3 saves no HF weights, only ``config.json`` beside
    ``global_step2/`` (shipped: written by Trainer + DeepSpeed 0.19.8, ``write_trainer_zero3_sample``).
    convert said "no HF config.json ... pass --hf-config" from the output dir, the checkpoint dir and
    the tag dir alike; it now reads that config. Checked against DeepSpeed's zero_to_fp32 oracle with
    transformers: no missing keys, the tied lm_head re-tied, the same logits."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path / "hf"
    result = run_cli("convert", str(SHIPPED / source), str(out), "--to", "hf")
    assert result.code == 0, result.err
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    config = AutoConfig.from_pretrained(str(SHIPPED / "trainer_zero3" / "checkpoint-2"))
    assert config.tie_word_embeddings
    reference = AutoModelForCausalLM.from_config(config).float()
    state = torch.load(str(SHIPPED / "trainer_zero3.fp32_oracle.pt"), weights_only=True)
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    reference.tie_weights()
    tokens = torch.arange(24).reshape(2, 12) % config.vocab_size
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, reference(tokens).logits)


def test_zero_to_fp32_bin_counts_every_parameter_of_its_flat_storage(tmp_path):
    """DeepSpeed's ``zero_to_fp32`` ``.bin`` (shipped, written by DeepSpeed from the zero2 sample) keeps
    every tensor as a slice of one flat storage: counted as tied aliases, inspect said 450 of 1,989
    parameters. Views that do not overlap are separate data; the values equal DeepSpeed's oracle."""
    import json

    import torch

    source = SHIPPED / "zero2_fp32_bin"
    data = json.loads(run_cli("inspect", "--json", str(source)).out)
    want = torch.load(str(SHIPPED / "zero2.fp32_oracle.pt"), weights_only=True)
    assert data["metadata"]["num_params"] == sum(v.numel() for v in want.values())
    assert not any("shares_storage_with" in json.dumps(t) for t in data["tensors"])
    oracle = tmp_path / "oracle.safetensors"
    from safetensors.torch import save_file

    save_file(want, str(oracle))
    report = json.loads(run_cli("diff", "--json", str(source), str(oracle)).out)
    assert report["summary"]["equal"] == len(want) - 1 and report["summary"]["dtype_mismatch"] == 1
    # the frozen param keeps its stored dtype in zero_to_fp32's output (the oracle holds it as float32)
    frozen = next(t for t in report["tensors"] if t["status"] != "equal")
    assert frozen["name"] == "model.layers.0.input_layernorm.weight" and frozen["status"] == "dtype_mismatch" and frozen["num_diff"] == 0


def test_trainer_save_model_under_zero3_is_the_final_model_not_another_iteration(tmp_path):
    """Under ZeRO-3 without 16-bit gathering, ``trainer.save_model()`` writes a DeepSpeed save (``global_stepN/``
    + ``latest`` + ``config.json``) into ``output_dir`` itself (a probe's Trainer run). It was listed as a
    second iteration N beside ``checkpoint-N``: timeline showed a step N->N, flagged it stale and exited 1,
    and the default and ``--iteration N`` opened different saves. It is the run's ``final`` model now. The
    layout is the shipped Trainer sample's own files, with its checkpoint's save copied where save_model
    puts it."""
    out = tmp_path / "out"
    shutil.copytree(SHIPPED / "trainer_zero3", out)
    checkpoint = out / "checkpoint-2"
    for name in ("global_step2", "latest", "config.json"):
        copy = shutil.copytree if (checkpoint / name).is_dir() else shutil.copy
        copy(checkpoint / name, out / name)
    listed = json.loads(run_cli("inspect", "--json", str(out)).out)
    assert [i["iteration"] for i in listed["iterations"]] == ["final", 2], listed["iterations"]
    assert "opened  ./ (final)" in run_cli("inspect", str(out)).out
    assert "opened  checkpoint-2" in run_cli("inspect", "--iteration", "2", str(out)).out
    result = run_cli("convert", str(out), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err


def test_save_16bit_model_weights_beside_deepspeed_saves_do_not_hide_them(tmp_path):
    """``engine.save_16bit_model(dir)`` beside ``engine.save_checkpoint(dir)``: the dir holds a
    ``pytorch_model.bin`` (16-bit, possibly from an older step) and the saves ``latest`` names. It opened as
    a plain HF dir, so convert exported the stale 16-bit copy and ``--iteration`` was refused (a probe). It
    is a DeepSpeed save dir now: the save 'latest' names is the model (DeepSpeed's zero_to_fp32 oracle),
    the weights beside it open by their file."""
    import torch

    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "zero3", save)
    oracle = torch.load(str(SHIPPED / "zero3.fp32_oracle.pt"), weights_only=True)
    torch.save({k: (v * 0.5).to(torch.bfloat16) for k, v in oracle.items()}, save / "pytorch_model.bin")
    (save / "config.json").write_text((SHIPPED / "hf_config" / "config.json").read_text())
    inspected = run_cli("inspect", str(save))
    assert inspected.code == 0 and "DeepSpeed save dir (latest: global_step2; HF weights beside" in inspected.out
    result = run_cli("convert", str(save), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err
    from safetensors.torch import load_file

    written = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert all(torch.equal(written[k], oracle[k]) for k in written)
    assert run_cli("inspect", "--iteration", "2", str(save)).code == 0
    assert run_cli("inspect", str(save / "pytorch_model.bin")).code == 0


@pytest.mark.parametrize("stage", (2, 3))
def test_rank_files_in_torchs_legacy_format_are_read(saves, stage, tmp_path):
    """DeepSpeed's ``"checkpoint": {"checkpoint_serialization": false}`` saves every rank file with
    ``torch.save(..., _use_new_zipfile_serialization=False)`` (its TorchCheckpointEngine). Every file was
    "corrupt torch zip file" (a probe). Here the shipped saves' rank files are written again that way
    (torch.load needs DeepSpeed's classes for the optimizer files) and must read as before, bitwise."""
    import torch

    pytest.importorskip("deepspeed")
    save = tmp_path / "save"
    shutil.copytree(saves[stage], save)
    for path in (save / TAG).glob("*.pt"):
        torch.save(torch.load(path, weights_only=False), path, _use_new_zipfile_serialization=False)
        assert not path.read_bytes().startswith(b"PK")
    assert run_cli("check", str(save)).code == 0
    with open_checkpoint(save) as reader:
        assert_bitwise(reader, oracle(saves[stage]))


def test_a_tied_alias_in_a_universal_checkpoint_is_its_targets_master(tmp_path):
    """For a tied model, DeepSpeed records ``shared_params = {"lm_head.weight": "model.embed_tokens.weight"}``
    and ``ds_to_universal --inject_missing_state`` still writes ``zero/lm_head.weight/fp32.pt``, from the
    low-precision module copy. ckptscope read lm_head from that folder, 1.4e-4 off the embedding that
    DeepSpeed's zero_to_fp32 gives for both (a probe on a real tied save). Here the shipped universal save
    (DeepSpeed's own) records the tie as a tied model's does; lm_head must read as the embedding's master."""
    import numpy as np
    import torch

    save = tmp_path / "universal"
    shutil.copytree(SHIPPED / "universal_zero2", save)
    states = save / "global_step2_universal" / "mp_rank_00_model_states.pt"
    obj = torch.load(states, weights_only=False)
    obj["shared_params"] = {"lm_head.weight": "model.embed_tokens.weight"}
    torch.save(obj, states)
    assert (save / "global_step2_universal" / "zero" / "lm_head.weight" / "fp32.pt").is_file()
    with open_checkpoint(save) as reader:
        embedding = reader.read("model.embed_tokens.weight")
        assert np.array_equal(reader.read("lm_head.weight"), embedding)
        assert reader.meta("lm_head.weight").attr("shares_storage_with") == "model.embed_tokens.weight"
    # counted once, as model.parameters() counts a tied pair (the folders come sorted, lm_head first: it was twice)
    result = run_cli("inspect", "--json", str(save))
    assert result.code == 0, result.err
    want = sum(v.size for k, v in oracle(SHIPPED / "zero2").items() if k != "lm_head.weight")
    assert json.loads(result.out)["metadata"]["num_params"] == want


def test_a_save_dir_with_tags_of_its_own_is_read_through_latest_and_says_why_it_has_no_iterations(tmp_path):
    """``engine.save_checkpoint(dir, tag="tag_a")``: the shipped save under a tag of the user's own. inspect
    follows ``latest`` (as DeepSpeed's load does); timeline and --iteration named verl's pattern only."""
    save = tmp_path / "save"
    shutil.copytree(SHIPPED / "zero2", save)
    (save / TAG).rename(save / "tag_a")
    (save / "latest").write_text("tag_a")
    with open_checkpoint(save) as reader:
        assert_bitwise(reader, oracle(SHIPPED / "zero2"))
    for command in (["timeline", str(save)], ["inspect", "--iteration", "2", str(save)]):
        result = run_cli(*command)
        assert result.code == 2 and "'latest' names 'tag_a'" in result.err and result.err.count("\n") == 1, result.err


def test_universal_checkpoint_is_read_by_its_layout_and_labelled_by_its_config(tmp_path):
    """The run's ds_config labels a universal checkpoint (ZeRO-1 was said ZeRO-2); it must not choose how the
    save is read: with a config saying stage 0 (BF16_Optimizer's), the first version of that fix lost the
    ``lp_params.`` copies (81 tensors -> 61, a reviewer)."""
    import torch

    root = tmp_path / "u"
    shutil.copytree(universal(1), root)
    with open_checkpoint(root) as reader:
        before = set(reader.index().tensors)
    states = next(root.rglob("mp_rank_00_model_states.pt"))
    obj = torch.load(states, weights_only=False)
    obj["ds_config"]["zero_optimization"]["stage"] = 0
    torch.save(obj, states)
    with open_checkpoint(root) as reader:
        index = reader.index()
        assert index.metadata["deepspeed"]["zero_stage"] == 0
        assert set(index.tensors) == before and any(n.startswith("lp_params.") for n in before)


def test_diff_says_the_module_copies_are_among_what_it_left_out():
    """A probe edited only the bf16 module copy of a ZeRO-2 save: diff said identical (the model is the fp32
    masters, as zero_to_fp32 and a full resume take it) and its note called all of the rest 'optimizer'.
    The note now names the low-precision copies, which a load_module_only resume would use."""
    result = run_cli("diff", "--json", str(SHIPPED / "zero1"), str(SHIPPED / "zero1"))
    assert result.code == 0, result.err
    notes = json.loads(result.out)["notes"]
    assert any("the module's low-precision copies (lp_params.*)" in n and "--training-state" in n for n in notes), notes


def test_latest_naming_a_tag_of_its_own_beside_numbered_saves_is_the_default(tmp_path):
    """``save_checkpoint(dir, tag="final_tag")`` after numbered saves: DeepSpeed resumes from, and
    zero_to_fp32 exports, what ``latest`` names. Only ``global_stepN`` dirs were listed, so a probe's root
    (real DeepSpeed 0.19.8) exported its older ``global_step2`` and ``check`` called the save damaged."""
    root = tmp_path / "run"
    root.mkdir()
    shutil.copytree(SHIPPED / "zero1" / TAG, root / TAG)            # the older, numbered save
    shutil.copytree(SHIPPED / "zero2" / TAG, root / "final_tag")    # the newer one, under the user's tag
    (root / "latest").write_text("final_tag")
    want, older = oracle(SHIPPED / "zero2"), oracle(SHIPPED / "zero1")
    assert any(n not in older or want[n].tobytes() != older[n].tobytes() for n in want)  # the saves tell apart
    check = run_cli("check", str(root))
    assert check.code == 0 and "final_tag" in check.out + check.err, (check.out, check.err)
    listing = run_cli("inspect", str(root))
    assert listing.code == 0 and "final_tag" in listing.out and "global_step2" in listing.out, listing.out
    timeline = run_cli("timeline", str(root))  # one numbered save: the tag has no step to order it by, said so
    assert timeline.code == 2 and "final_tag has no step number to order by" in timeline.err, timeline.err
    for picked, expected in ((None, want), ("final_tag", want), ("2", older)):
        out = tmp_path / f"out_{picked}"
        extra = ("--iteration", picked) if picked else ()
        result = run_cli("convert", str(root), str(out), "--to", "hf", "--hf-config", str(SHIPPED / "hf_config"), *extra)
        assert result.code == 0, result.err
        from safetensors.numpy import load_file

        got = {k: v for f in out.glob("*.safetensors") for k, v in load_file(str(f)).items()}
        for name, value in expected.items():  # (zero1's oracle leaves its frozen norm out)
            assert got[name].tobytes() == value.tobytes(), (picked, name)


def test_a_model_states_file_opened_alone_says_what_it_holds(saves, tmp_path):
    """One ``*model_states.pt`` file on its own (a probe, real DeepSpeed 0.19.8): the ZeRO-3 one read as a
    model of 0 parameters that checked ok; it is damage-like now (placeholders: check exits 1, convert refuses
    with the reason), and a ZeRO-1/2 one warns that the fp32 masters are in the optimizer files."""
    zero3 = saves[3] / TAG / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    check = run_cli("check", str(zero3))
    assert check.code == 1 and "placeholders of 0 elements" in check.out, check.out
    out = tmp_path / "out"
    refused = run_cli("convert", str(zero3), str(out), "--to", "hf", "--hf-config", str(SHIPPED / "hf_config"))
    assert refused.code == 2 and refused.err.count("\n") == 1 and "ZeRO-3 model-states" in refused.err and not out.exists()
    zero2 = saves[2] / TAG / "mp_rank_00_model_states.pt"
    inspected = run_cli("inspect", "--json", str(zero2))
    assert inspected.code == 0
    assert any("fp32 master weights" in w for w in json.loads(inspected.out)["metadata"]["warnings"])
    assert run_cli("check", str(zero2)).code == 0
