"""Training the task batches of several runs at once (run batching, ``--batch-runs``).

:func:`run_joint` gets one batch of tasks per simulation (each with the executor of its
run) and trains them together: every run's vectorized executor first runs serially what it
would run serially alone (:meth:`VectorizedExecutor.plan_blocks`: lone tasks, unbatchable
models), then the groups of runs whose executors have the same
:meth:`~VectorizedExecutor.joint_signature` (same training-set tensors, model structure,
optimiser and loss) and the same (batch size, work shape, learning-rate scale) become one
group, cut into blocks as one run's group would be. Each task keeps its own run's batches,
client size and momentum buffers, so its contribution is the one it gets in its run alone:
bit for bit where the kernels do not depend on the block's size (``nn.Linear`` models), to
float tolerance otherwise (a convolution's algorithm may change with the number of clients).
Executors of other kinds (serial, Ray) run their batches on their own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from fedclock.sim.types import Contribution, Task
from fedclock.train.vectorized import VectorizedExecutor


def run_joint(calls: Sequence[tuple[Any, Sequence[Task]]]) -> list[list[Contribution]]:
    """The contributions of every (executor, tasks) call, in each call's task order."""
    outs: list[list[Contribution | None]] = []
    # joint key → [(call, task index)], in call order then each run's group order
    joint: dict[Hashable, list[tuple[int, int]]] = {}
    for c, (executor, tasks) in enumerate(calls):
        if not isinstance(executor, VectorizedExecutor):
            outs.append(list(executor.run(tasks)))
            continue
        out, groups = executor.plan_blocks(tasks)
        outs.append(out)
        signature = executor.joint_signature()
        for key, members in groups.items():
            jkey = (c, key) if signature is None else (signature, key)
            joint.setdefault(jkey, []).extend((c, i) for i in members)
    for together in joint.values():
        # most steps first over the whole group (stable: each run's order is kept)
        together.sort(key=lambda ci: -calls[ci[0]][1][ci[1]].plan.local_steps)
        lead: VectorizedExecutor = calls[together[0][0]][0]
        size = lead.block_size(calls[together[0][0]][1][together[0][1]].plan.batch_size)
        for start in range(0, len(together), size):
            block = together[start : start + size]
            tasks = [calls[c][1][i] for c, i in block]
            owners = [calls[c][0] for c, _ in block]
            if all(o is owners[0] for o in owners):  # one run's block: as in that run alone
                done = owners[0]._run_block(tasks)
            else:
                done = lead._run_block(tasks, owners)
            for (c, i), contribution in zip(block, done, strict=True):
                outs[c][i] = contribution
    return [[x for x in out if x is not None] for out in outs]


__all__ = ["run_joint"]
