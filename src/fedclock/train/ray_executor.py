"""Client training on Ray actors (``executor.kind: ray``, ``executor.workers: N``).

Each actor holds its own copy of the executor :func:`fedclock.train.factory.make_executor`
builds (vectorized where the model allows), made once from the model, data and training
settings put into Ray's object store. A batch of dispatched tasks is cut into ``workers``
contiguous blocks, one per actor; each model version the blocks start from is put into the
object store once and travels to the actors by reference (a task carries only its plan,
cost, timing and the version's reference). The contributions come back in task order,
attached to the driver's own tasks, so the simulator, the virtual clock and every metric
are those of the local executors: a task's batches are keyed by (seed, client, version,
repeat), not by where it trains.

It pays when local training dominates a run (a VGG or ResNet on CIFAR, many clients per
step) and the cluster has more cores than one machine; for the MLPs of MNIST the transfer
of versions and deltas costs more than it saves. Per-client momentum (SALF's reference
mode keeps each user's optimizer across rounds) would have to follow its client from actor
to actor and is refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from fedclock.errors import ConfigError
from fedclock.sim.types import Contribution, ModelVersion, Task


class _Worker:
    """A Ray actor: one executor, built once; runs blocks of tasks."""

    def __init__(self, build: Callable[[], Any], threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.executor = build()

    def run(self, tasks: list[Task], versions: dict[int, Any]) -> list[Contribution]:
        import ray

        got = dict(zip(versions, ray.get(list(versions.values())), strict=True))
        for t in tasks:
            t.base = got[t.base.version]
        out = self.executor.run(tasks)
        for c in out:  # the driver re-attaches its own task (and its base version)
            c.task = dataclasses.replace(c.task, base=ModelVersion(c.task.base.version, {}))
        return out


class RayExecutor:
    """Runs each batch of tasks in blocks on ``workers`` Ray actors (see the module doc)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (stateless: no per-client momentum)

    def __init__(
        self,
        build: Callable[[], Any],
        *,
        workers: int | None = None,
        address: str | None = None,
        momentum_per_client: bool = False,
    ) -> None:
        if momentum_per_client:
            raise ConfigError(
                "executor.kind 'ray' does not keep per-client momentum (SALF's reference "
                "mode); use executor.kind 'auto'."
            )
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "executor.kind 'ray' needs Ray: pip install 'fedclock[ray]' (or pip install ray)."
            ) from None
        self._ray = ray
        self._started = not ray.is_initialized()
        address = address or os.environ.get("RAY_ADDRESS")
        if self._started:
            if address is not None:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=workers or os.cpu_count(), include_dashboard=False,
                    log_to_driver=False, configure_logging=False,
                )  # fmt: skip
        n = workers or int(ray.available_resources().get("CPU", 1)) or 1
        actor = ray.remote(num_cpus=1)(_Worker)
        built = ray.put(build)
        self.workers = n
        self._actors: list[Any] = [actor.remote(built, 1) for _ in range(n)]
        self._refs: dict[int, tuple[ModelVersion, Any]] = {}  # id(version) → (it, its ref)

    def _ref(self, version: ModelVersion) -> Any:
        got = self._refs.get(id(version))
        if got is None or got[0] is not version:
            got = self._refs[id(version)] = (version, self._ray.put(version))
        return got[1]

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        if not tasks:
            return []
        # put each version once; forget the versions no task of this batch starts from
        used = {id(t.base): t.base for t in tasks}
        self._refs = {k: v for k, v in self._refs.items() if k in used}
        n = min(self.workers, len(tasks))
        size = -(-len(tasks) // n)
        futures = []
        for i in range(n):
            block = tasks[i * size : (i + 1) * size]
            if not block:
                continue
            versions = {t.base.version: self._ref(t.base) for t in block}
            light = [dataclasses.replace(t, base=ModelVersion(t.base.version, {})) for t in block]
            futures.append(self._actors[i].run.remote(light, versions))
        by_id = {t.task_id: t for t in tasks}
        out = []
        for block_result in self._ray.get(futures):
            for c in block_result:
                c.task = by_id[c.task.task_id]
                out.append(c)
        return out

    def close(self) -> None:
        """Release the actors (and the local Ray this executor started)."""
        for a in self._actors:
            self._ray.kill(a)
        self._actors = []
        self._refs = {}
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
