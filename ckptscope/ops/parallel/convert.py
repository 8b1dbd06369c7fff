"""``convert`` / ``merge`` on the ranks of a torchrun group.

Each rank writes whole output files of the plan (safetensors shards, ``.distcp`` data files, legacy
``mp_rank_*`` files), the ones ``partition.assign`` gives it by bytes, into one staging directory
rank 0 made next to DST (DST must be on a filesystem every node sees). After every rank is done
(the ``agree`` steps are the barrier), rank 0 writes what marks the output complete (the HF index
and config, torch_dist ``.metadata`` from every rank's chunk CRC-32s, ``common.pt``,
``metadata.json``, the tracker) and renames the staging directory into place. On any failure rank
0 removes the staging directory; if rank 0 itself is killed it stays as ``.DST.XXXX.tmp``, never
at DST, and a rerun makes a fresh one.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.ops.atomic import atomic_output, check_destination
from ckptscope.ops.convert.hf_target import finish_hf, hf_shard_bytes, write_hf_shards
from ckptscope.ops.convert.mcore_target import finish_mcore, mcore_file_bytes, write_mcore_files
from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Progress, current_tensor
from ckptscope.ops.parallel.group import Group
from ckptscope.ops.parallel.partition import assign


def output_files(plan: ConvertPlan) -> dict[str, int]:
    """Every data file of the output (relative to the staging dir for HF, to the iteration dir for
    Megatron-Core) and its bytes."""
    return hf_shard_bytes(plan) if plan.target == "hf" else mcore_file_bytes(plan)


def share(plan: ConvertPlan, group: Group) -> tuple[set[str], int]:
    """This rank's files and their bytes."""
    files = output_files(plan)
    mine = assign(files, group.world)[group.rank]
    return set(mine), sum(files[f] for f in mine)


def execute_convert_parallel(plan: ConvertPlan, group: Group, *, overwrite: bool = False,
                             progress: Progress | None = None) -> Path:
    try:
        return _execute(plan, group, overwrite, progress)
    except CkptError:
        group.settle()  # rank 0 has removed the staging dir: only now may torchrun stop the others
        raise


def _execute(plan: ConvertPlan, group: Group, overwrite: bool, progress: Progress | None) -> Path:
    dst = Path(plan.dst)
    mine, _ = share(plan, group)
    with ExitStack() as stack:
        def prepare() -> str | None:
            if group.rank != 0:
                return None
            check_destination(Path(plan.src), dst, overwrite=overwrite)
            return str(stack.enter_context(atomic_output(dst, directory=True, overwrite=overwrite)))

        staging = Path(group.broadcast(group.agree(prepare, "preparing the destination"), "sharing the staging dir"))

        def reach() -> None:
            if not staging.is_dir():
                raise CkptError(f"rank 0's staging dir {staging} is not visible here: DST must be on a "
                                "filesystem every node shares")

        group.agree(reach, "checking the staging dir")

        def write() -> dict[int, int]:
            if plan.target == "hf":
                write_hf_shards(plan, staging, mine, progress)
                return {}
            return write_mcore_files(plan, staging, mine, progress)

        crcs = group.agree(write, "writing", tensor=current_tensor)
        gathered = group.gather(crcs, "collecting checksums")

        def finish() -> None:
            if group.rank != 0:
                return
            if plan.target == "hf":
                finish_hf(plan, staging)
            else:
                merged: dict[int, int] = {}
                for part in gathered or []:
                    merged.update(part)
                finish_mcore(plan, staging, merged)
            stack.close()  # atomic_output: rename into place

        group.agree(finish, "finishing")
    return dst
