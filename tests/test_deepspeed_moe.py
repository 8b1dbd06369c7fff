"""DeepSpeed MoE saves: the module plus every expert file (ZeRO-0), or the fp32 masters of the expert
param groups, partitioned over expert-data-parallel ranks (ZeRO-1/2), read as one model.

The saves are written by DeepSpeed 0.19.8's own engine (``make_deepspeed_samples.MOE_VARIANTS`` and
``MOE_DP2_VARIANTS``/``MOE_DE_VARIANTS``, shipped in ``sample_ckpts/deepspeed_zero``):
``deepspeed.moe.layer.MoE`` with 4 experts at ep_size=2 on 2 gloo CPU ranks (each expert group whole on
its rank) or on 4 (ep 2 x expert data parallel 2, DeepSpeed's E + D topology and its D + E one), one step,
``engine.save_checkpoint``. The oracle beside each save is what DeepSpeed's engine held after it, gathered
by the generator from every rank with each local expert under its global id (DeepSpeed's own
``groups._get_expert_parallel_rank``): ``engine.module.state_dict()`` at ZeRO-0, DeepSpeed's
``safe_get_full_fp32_param`` under ZeRO-1/2. Never read back through ckptscope.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import run_cli
from dist_reference import SAMPLES

from ckptscope.formats.deepspeed import moe
from ckptscope.ops.opening import open_checkpoint

SHIPPED = SAMPLES / "deepspeed_zero"
ASSEMBLED = ("moe_zero0", "moe_bf16_zero0", "moe_bf16_zero1", "moe_bf16_zero1_dp2", "moe_bf16_zero2_dp2_de",
             "moe_bf16_zero2_two_sizes")
TAG = "global_step1"
EXPERT = "moe.deepspeed_moe.experts.deepspeed_experts.{}.0.weight"


def _oracle(name: str) -> dict[str, np.ndarray]:
    import torch

    state = torch.load(str(SHIPPED / f"{name}.oracle.pt"), weights_only=True)
    return {k: _numpy(v) for k, v in state.items()}


def _numpy(tensor) -> np.ndarray:
    import torch

    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


@pytest.mark.parametrize("name", ASSEMBLED)
def test_every_expert_is_in_the_model_bit_for_bit(name):
    """Before, the expert files were "not assembled": check failed and the model lacked every expert. Under
    ZeRO-1/2 the reader had even cut rank 0's expert partition as if it were the whole world's."""
    want = _oracle(name)
    assert {EXPERT.format(e) for e in range(4)} <= set(want)
    result = run_cli("check", str(SHIPPED / name))
    assert result.code == 0, result.out + result.err
    result = run_cli("inspect", "--json", str(SHIPPED / name))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    model = {t["name"] for t in doc["tensors"] if t["role"] == "model"}
    assert model == set(want)
    assert not any("not assembled" in w for w in doc["metadata"]["warnings"])
    with open_checkpoint(SHIPPED / name) as reader:
        for tensor, value in want.items():
            got = reader.read(tensor)
            assert got.dtype == value.dtype and got.shape == value.shape, tensor
            assert got.tobytes() == value.tobytes(), tensor


@pytest.mark.parametrize("name", ["moe_bf16_zero1", "moe_bf16_zero1_dp2", "moe_bf16_zero2_dp2_de"])
def test_under_zero_the_expert_files_are_the_masters_low_precision_copies(name):
    """Each expert's bf16 weights (its own file) are its fp32 master rounded, as DeepSpeed writes them after
    the step: listed as ``lp_params.`` training state, each master piece checked against them by ``check``."""
    import ml_dtypes

    with open_checkpoint(SHIPPED / name) as reader:
        index = reader.index()
        for e in range(4):
            master, copy = EXPERT.format(e), "lp_params." + EXPERT.format(e)
            assert index.tensors[copy].files == (f"{TAG}/{moe.file_name(0, e, 0)}",)
            assert index.tensors[master].attr("zero") is not None
            want = reader.read(master).astype(ml_dtypes.bfloat16)
            assert reader.read(copy).tobytes() == want.tobytes(), e


def test_ranks_with_their_expert_groups_in_another_order_are_read_by_each_ranks_own(tmp_path):
    """Two MoE layers of different expert-parallel sizes: DeepSpeed orders the two expert param groups per
    process, and in this save (written by it) some ranks have them the other way round from rank 0, whose
    order ``param_shapes`` records. Each rank's partitions are found by the params they hold; read by index,
    every expert of those ranks was another group's bytes (a probe)."""
    from ckptscope.formats.pickles.torch_file import read_torch_zip  # (torch.load needs DeepSpeed's classes)

    orders = set()
    for r in range(4):
        path = SHIPPED / "moe_bf16_zero2_two_sizes" / TAG / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
        groups = read_torch_zip(path).obj["optimizer_state_dict"]["base_optimizer_state"]["param_groups"]
        orders.add(tuple(g["name"] for g in groups))
    assert len(orders) == 2, orders
    want = _oracle("moe_bf16_zero2_two_sizes")
    assert sum(".deepspeed_experts." in n for n in want) == 4 * 4 + 8 * 2
    result = run_cli("check", str(SHIPPED / "moe_bf16_zero2_two_sizes"))
    assert result.code == 0, result.out


def test_group_orders_by_the_params_held_then_by_name():
    shapes = [["a", "b"], ["x.deepspeed_experts.0.w"], ["y.deepspeed_experts.0.w", "y.deepspeed_experts.1.w"]]
    ranks = {0: ([["a"], ["x.deepspeed_experts.0.w"], ["y.deepspeed_experts.0.w"]], ["p", "e2", "e4"]),
             1: ([["b"], ["y.deepspeed_experts.1.w"], []], ["p", "e4", "e2"])}
    assert moe.group_orders(shapes, ranks) == {0: {0: 0, 1: 1, 2: 2}, 1: {0: 0, 2: 1, 1: 2}}


def test_optimizer_files_of_two_ranks_swapped_are_caught(tmp_path):
    """What reading a save in the wrong topology (E + D for D + E) looks like: the partitions of one
    expert-parallel rank read as another's. check's copy comparison fails on it, and exports refuse."""
    save = _copy(tmp_path, "moe_bf16_zero2_dp2_de")
    a, b = (save / TAG / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (1, 2))
    a.rename(tmp_path / "x")
    b.rename(a)
    (tmp_path / "x").rename(b)
    result = run_cli("check", str(save))
    assert result.code == 1 and "copy-mismatch" in result.out, result.out


def test_each_expert_comes_from_its_own_file():
    with open_checkpoint(SHIPPED / "moe_zero0") as reader:
        index = reader.index()
    for e in range(4):
        assert index.tensors[EXPERT.format(e)].files == (f"{TAG}/{moe.file_name(0, e, 0)}",)


def test_other_expert_parallel_ranks_optimizer_state_is_training_state():
    """Rank 0's optimizer state is the model states' ``optimizer``; rank 1's (its own experts' moments) is in
    ``expp_rank_1_mp_rank_00_optim_states.pt``, listed under ``optimizer.expp_rank_1.`` (judge: torch.load)."""
    import torch

    stored = torch.load(str(SHIPPED / "moe_zero0" / TAG / "expp_rank_1_mp_rank_00_optim_states.pt"),
                        weights_only=True)["optimizer"]["state"]
    result = run_cli("inspect", "--json", str(SHIPPED / "moe_zero0"))
    roles = {t["name"]: t["role"] for t in json.loads(result.out)["tensors"]}
    with open_checkpoint(SHIPPED / "moe_zero0") as reader:
        for param, moments in stored.items():
            for key, value in moments.items():
                name = f"optimizer.expp_rank_1.state.{param}.{key}"
                assert roles[name] == "optimizer", name
                assert np.array_equal(reader.read(name), value.numpy()), name


def test_bf16_module_weights_say_where_the_fp32_masters_are():
    result = run_cli("inspect", "--json", str(SHIPPED / "moe_bf16_zero0"))
    warnings = json.loads(result.out)["metadata"]["warnings"]
    assert any("fp32 masters are in the optimizer state by position" in w for w in warnings), warnings
    result = run_cli("inspect", "--json", str(SHIPPED / "moe_zero0"))
    assert not any("fp32 masters" in w for w in json.loads(result.out)["metadata"]["warnings"])


def _copy(tmp_path: Path, name: str = "moe_zero0") -> Path:
    save = tmp_path / name
    shutil.copytree(SHIPPED / name, save)
    return save


def test_a_missing_expert_file_is_a_problem_and_exports_refuse(tmp_path):
    save = _copy(tmp_path)
    (save / TAG / moe.file_name(0, 3, 0)).unlink()
    result = run_cli("check", str(save))
    assert result.code == 1, result.out
    assert f"missing-file: {TAG}/{moe.file_name(0, 3, 0)}" in result.out, result.out
    assert "expert 3" in result.out
    result = run_cli("inspect", "--json", str(save))
    names = {t["name"] for t in json.loads(result.out)["tensors"]}
    assert EXPERT.format(2) in names and EXPERT.format(3) not in names


def test_expert_files_swapped_between_ids_are_one_line(tmp_path):
    """A file whose keys belong to another expert (renamed by hand, or copied from another save) would put
    weights under the wrong expert: refused in one line, exit 2."""
    save = _copy(tmp_path)
    a, b = save / TAG / moe.file_name(0, 1, 0), save / TAG / moe.file_name(0, 2, 0)
    a.rename(tmp_path / "x")
    b.rename(a)
    (tmp_path / "x").rename(b)
    for command in (["inspect"], ["check"]):
        result = run_cli(*command, str(save))
        assert result.code == 2, result.out + result.err
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and "not of expert" in lines[0] and "Traceback" not in result.err, result.err


def test_an_expert_changed_after_the_save_is_what_diff_reports(tmp_path):
    """diff compares the experts too: one weight of expert 2 changed (rewritten with torch.save, as a
    user's script would) is the one difference, exit 1."""
    import torch

    save = _copy(tmp_path)
    path = save / TAG / moe.file_name(0, 2, 0)
    state = torch.load(str(path), weights_only=True)
    state[EXPERT.format(2)][0, 0] += 1.0
    torch.save(state, str(path))
    result = run_cli("diff", "--json", str(SHIPPED / "moe_zero0"), str(save))
    assert result.code == 1, result.err
    different = [r["name"] for r in json.loads(result.out)["tensors"] if r["status"] == "different"]
    assert different == [EXPERT.format(2)], different


def test_an_expert_file_of_another_tensor_parallel_rank_is_not_assembled(tmp_path):
    """Megatron-DeepSpeed's MoE with tensor parallelism writes ``..._mp_rank_01_model_states.pt`` expert
    files too; their shards are not placed: check fails naming the file."""
    save = _copy(tmp_path)
    shutil.copy(save / TAG / moe.file_name(0, 0, 0), save / TAG / moe.file_name(0, 0, 1))
    result = run_cli("check", str(save))
    assert result.code == 1 and f"unassembled-file: {TAG}/{moe.file_name(0, 0, 1)}" in result.out, result.out


@pytest.mark.parametrize("found, counts, missing", [
    ({(0, 0), (0, 1)}, [2], []),
    ({(0, 0)}, [2], [(0, 1)]),
    ({(0, 0), (1, 1)}, [1, 2], [(1, 0)]),
    ({(moe.NO_LAYER, 0), (moe.NO_LAYER, 1)}, [2], []),
    ({(0, 0)}, None, []),
    ({(0, 0)}, [True], []),
])
def test_missing_experts_follow_num_experts(found, counts, missing):
    assert moe.missing_experts(found, counts) == missing


@pytest.mark.parametrize("name, parsed", [
    ("layer_3_expert_12_mp_rank_01_model_states.pt", moe.ExpertFile(3, 12, 1)),
    ("expert_5_mp_rank_00_model_states.pt", moe.ExpertFile(moe.NO_LAYER, 5, 0)),
    ("mp_rank_00_model_states.pt", None),
    ("layer_03-model_00-model_states.pt", None),
])
def test_expert_file_names(name, parsed):
    assert moe.expert_file(name) == parsed


def test_zero_saves_without_their_expert_files_still_place_the_masters(tmp_path):
    """Every expert file gone from a ZeRO-1 save: the fp32 masters are still cut per expert-parallel rank
    (they never came from those files), and each missing file is a problem."""
    save = _copy(tmp_path, "moe_bf16_zero1_dp2")
    for e in range(4):
        (save / TAG / moe.file_name(0, e, 0)).unlink()
    want = _oracle("moe_bf16_zero1_dp2")
    with open_checkpoint(save) as reader:
        for tensor, value in want.items():
            assert reader.read(tensor).tobytes() == value.tobytes(), tensor
    result = run_cli("check", str(save))
    assert result.code == 1 and result.out.count("missing-file") == 4, result.out
