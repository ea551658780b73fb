"""Fed-RAA (Zhang et al., resource-adaptive asynchronous FL of model fragments): the
scheduler math. See ``../shared/specs/fed_raa.md``; the fragments are the
:class:`~fedclock.models.shapes.Fragment` work shape.

- :func:`gre_raa` — Algorithm 2 (App. B): the fragment for an idle client;
- :func:`k_feasible` — the smallest delay bound K for which Algorithm 2 never finds S empty;
- :func:`k_offline` — the offline assignment's bound K (proof of Theorem 2);
- :class:`ShareDiscount` — the authors' updater's weight (reference mode);

and the strategy's parts: :class:`FragmentPlanner` (Algorithm 1's scheduler, with the
Random and MP-RAA ablations; q(j) changes in its ``on_commit`` hook) and
:func:`build_fedraa`. Algorithm 1's updater θ^j ← (1 − α_t)·θ^j + α_t·θ^j_new on the
fragment is :class:`~fedclock.strategies.aggregators.Update` with the ``mix`` target
and FedAsync's weighting α_t = α·s(staleness).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from fedclock.devices.cost import TaskCost
from fedclock.models.shapes import FRAGMENT_RATIOS, FULL, Fragment, Layout, build_units
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.aggregators import Importance, Update, keep_buffers, mix
from fedclock.strategies.base import Work
from fedclock.strategies.weights import Staleness

log = logging.getLogger(__name__)

#: the authors' discount s = 1/(1 + duration/100): its time scale in seconds (spec §2.2)
DISCOUNT_SECONDS = 100.0

#: the event that increments q(j), a fragment's update count (``strategy.count``)
COUNT_EVENTS = ("assigned", "completed")


def gre_raa(
    costs: Sequence[float], updates: Sequence[int], k: float, rng: np.random.Generator
) -> int:
    """Algorithm 2 for one idle client n: S = {j : c_{n,j} ≤ K}; h ← a fragment drawn
    uniformly from S; then, scanning S in index order, h ← j' whenever q(j') < q(h).

    So the result is a least-updated fragment of S: the drawn one if it is least-updated,
    else the first least-updated in index order (the algorithm's own tie rule).
    ``costs``: c_{n,j} for j = 1..M; ``updates``: q(j), the global updates of each fragment.
    Raises ValueError if S is empty (K below :func:`k_feasible`).
    """
    feasible = [j for j, c in enumerate(costs) if c <= k]
    if not feasible:
        raise ValueError(
            f"no fragment fits the delay bound K = {k:g} (the cheapest costs {min(costs):g})"
        )
    h = feasible[int(rng.integers(len(feasible)))]
    for j in feasible:
        if updates[j] < updates[h]:
            h = j
    return h


def gre_raa_reference(costs: Sequence[float], updates: Sequence[int], k: float) -> int:
    """Gre-RAA as the authors' code runs it (spec §2.2): start from fragment 1 (never
    checked against K), then for j = 2..M move to j if c_{n,j} ≤ K and q(j) < q(current) —
    the least-updated of {1} ∪ S, ties to the lowest index."""
    h = 0
    for j in range(1, len(costs)):
        if costs[j] <= k and updates[j] < updates[h]:
            h = j
    return h


def least_updated(updates: Sequence[int]) -> int:
    """MP-RAA's choice: the least-updated fragment (the first in index order on ties)."""
    return int(np.argmin(np.asarray(updates)))


def k_feasible(costs: np.ndarray) -> float:
    """max_n min_j c_{n,j}: the smallest K with a feasible fragment for every client."""
    return float(np.asarray(costs, dtype=np.float64).min(axis=1).max())


def k_offline(costs: np.ndarray) -> float:
    """The offline assignment's delay bound (proof of Theorem 2): clients ranked fastest
    first (by their cost of the largest fragment), fragments largest first; fragment j
    (1-based) goes to clients (j−1)·⌊N/M⌋+1 .. j·⌊N/M⌋ (the last one to every client
    left, N ≥ M), and K = the largest cost of an assigned pair. With N < M each client
    cycles over its own fragments (time division), so K is the largest cost of a client's
    set: we assign fragment j to client ⌊j·N/M⌋."""
    c = np.asarray(costs, dtype=np.float64)
    n, m = c.shape
    largest = int(np.argmax(c.sum(axis=0)))  # the largest fragment costs the most
    clients = np.argsort(c[:, largest], kind="stable")  # fastest first
    fragments = np.argsort(-c.mean(axis=0), kind="stable")  # largest first
    worst = 0.0
    if n >= m:
        per = n // m
        for rank, i in enumerate(clients):
            j = fragments[min(rank // per, m - 1)]
            worst = max(worst, float(c[i, j]))
    else:
        for jr, j in enumerate(fragments):
            i = clients[jr * n // m]
            worst = max(worst, float(c[i, j]))
    return worst


# ------------------------------------------------------------------ the strategy's parts
class FragmentPlanner:
    """Algorithm 1's scheduler: an idle client n gets fragment h(n) — Gre-RAA (Algorithm 2)
    over its costs c_{n,j} (the nominal time of its fragment-j task: download, compute,
    upload) and the fragments' update counts q(j), or Random / MP-RAA — as a
    :class:`~fedclock.models.shapes.Fragment` task of its local SGD plan. The choice's
    random draw comes from the stream ``("fragment", client, i)``, i the client's i-th task.

    Planning has no side effects: q(j) and i change only in :meth:`on_dispatch` (a task
    really started) and :meth:`on_commit` (updates used by a server step). ``count`` says
    which event increments q(j): ``assigned`` (a fragment handed out, as the authors' code
    counts) or ``completed`` (a global update of it, Alg. 1's wording).
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("_asked", "updates")  # (_work is a cache)

    def __init__(
        self,
        *,
        full_plans: Sequence[TaskPlan],
        layout: Layout,
        ratios: tuple[float, ...],
        costs: np.ndarray,
        k: float,
        scheduler: str,
        count: str = "assigned",
        reference: bool = False,
    ) -> None:
        if count not in COUNT_EVENTS:
            raise ValueError(f"unknown count event {count!r}; allowed: {', '.join(COUNT_EVENTS)}")
        self.full_plans, self.layout, self.ratios = full_plans, layout, ratios
        self.costs, self.k, self.scheduler, self.count = costs, k, scheduler, count
        self.updates = [0] * len(ratios)  # q(j)
        self.reference = reference
        self.kind = "elements" if reference else "neurons"
        self._asked = [0] * len(full_plans)  # tasks dispatched to each client so far
        self._work: dict[tuple[int, int], tuple[TaskPlan, TaskCost]] = {}

    def fragment_plan(self, client: int, j: int) -> tuple[TaskPlan, TaskCost]:
        got = self._work.get((client, j))
        if got is None:
            plan = replace(self.full_plans[client], shape=Fragment(j, self.ratios, self.kind))
            got = self._work[(client, j)] = (plan, plan.shape.cost(self.layout, plan.samples))
        return got

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        """The full model's task (update times τ_i, clients.csv)."""
        full = self.full_plans[client]
        return full, FULL.cost(self.layout, full.samples)

    def choose(self, ctx: Context, client: int, updates: Sequence[int]) -> int:
        """h(n) for ``client``'s next task given the counts ``updates`` (no side effects)."""
        if self.scheduler == "mp-raa":
            return least_updated(updates)
        if self.scheduler == "gre-raa" and self.reference:
            return gre_raa_reference(self.costs[client], updates, self.k)
        rng = ctx.rng("fragment", client, self._asked[client])
        if self.scheduler == "random":
            return int(rng.integers(len(self.ratios)))
        return gre_raa(self.costs[client], updates, self.k, rng)

    def plan(self, ctx: Context, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.fragment_plan(client, self.choose(ctx, client, self.updates))

    def assign(self, ctx: Context, r: int, clients: np.ndarray) -> list[Work]:
        """Sync Fed-RAA: every participant of round ``r`` gets a fragment, in client order;
        counting at assignment, each choice sees the round's earlier ones (as dispatch will
        count them)."""
        updates = list(self.updates)
        out = []
        for c in clients:
            j = self.choose(ctx, int(c), updates)
            if self.count == "assigned":
                updates[j] += 1
            out.append(Work(*self.fragment_plan(int(c), j)))
        return out

    def on_dispatch(self, task: Task) -> None:
        shape = task.plan.shape
        if isinstance(shape, Fragment):
            self._asked[task.client] += 1
            if self.count == "assigned":
                self.updates[shape.index] += 1

    def on_commit(self, contributions: Sequence[Contribution]) -> None:
        if self.count == "completed":
            for c in contributions:
                shape = c.task.plan.shape
                if isinstance(shape, Fragment):
                    self.updates[shape.index] += 1


#: reference mode's weight a of θ + a·Δ (``strategy.reference_weight``; the ablation of
#: docs/reproductions/fed-raa.md): which of the two factors (n_i/n)·s are kept (its ``mix``
#: is no weight of the sum but Alg. 1's mixing update: ``_rounds_and_update``)
REFERENCE_WEIGHTS = ("share-discount", "share", "discount", "one")


class ShareDiscount:
    """The authors' updater's weight (reference mode, spec §2.2): θ ← θ + a·Δ on each
    arrival, a = (n_i / n_total)·s, s = 1/(1 + duration/100), duration = the update's
    virtual time from dispatch to arrival (not a staleness in versions); Δ is zero outside
    the fragment on the split tensors and dense on the shared ones. ``kind`` drops either
    factor (``share``: a = n_i/n, ``discount``: a = s, ``one``: a = 1), an ablation."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, total_samples: int, kind: str = "share-discount") -> None:
        if kind not in REFERENCE_WEIGHTS:
            raise ValueError(f"reference weight {kind!r} is not one of {REFERENCE_WEIGHTS}")
        self.total = total_samples
        self.share = kind in ("share-discount", "share")
        self.discount = kind in ("share-discount", "discount")

    def weight(self, num_samples: int, duration: float) -> float:
        """a = (n_i/n)·s with the factors ``kind`` keeps (1 for a dropped one)."""
        share = num_samples / self.total if self.share else 1.0
        return share / (1.0 + duration / DISCOUNT_SECONDS) if self.discount else share

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        return np.array(
            [self.weight(c.num_samples, ctx.now - c.task.t_start) for c in contributions]
        )


def _rounds_and_update(s: Any, planner: FragmentPlanner, total_samples: int) -> tuple[Any, Update]:
    """The trigger and the server update: Sync's rounds of every client with a sample-weighted
    sum; otherwise a server step per arrival with Alg. 1's mixing, or the authors' share
    discount (reference mode)."""
    from fedclock.strategies.asynchronous import (
        ArrivalBuffer,
        ConstantWeight,
        StalenessWeighting,
        UpdateTimes,
    )
    from fedclock.strategies.server import server_optimizer
    from fedclock.strategies.triggers import SyncRounds

    server = server_optimizer(s, lr=1.0)
    if s.own("sync"):  # the ablation
        return SyncRounds(work=planner), Update(Importance(s.weights), server=server)
    trigger = ArrivalBuffer(UpdateTimes("profile", planner), buffer_size=1,
                            concurrency=s.concurrency)  # fmt: skip
    if s.mode == "reference" and s.reference_weight != "mix":
        weight = ShareDiscount(total_samples, s.reference_weight)
        return trigger, Update(weight, buffers=keep_buffers, server=server)
    # Alg. 1's updater: θ^j ← (1 − α_t)·θ^j + α_t·θ^j_new, α_t = α·s(staleness) (also the
    # reference-mode ablation ``mix``: on the authors' element-wise fragments)
    staleness = Staleness(
        kind=s.staleness, a=s.staleness_a, b=s.staleness_b, normalize_at=s.staleness_normalize_at
    )
    return trigger, Update(StalenessWeighting(ConstantWeight(s.alpha), staleness), target=mix,
                           buffers=keep_buffers, server=server)  # fmt: skip


def build_fedraa(cfg: Any, info: Any) -> Any:
    """The Fed-RAA strategy: FragmentPlanner × an arrival trigger (a server step per
    arrival, every client busy) × Algorithm 1's updater (an Update), with the proximal term ρ."""
    from fedclock.errors import ConfigError
    from fedclock.strategies.base import Strategy
    from fedclock.strategies.planners import local_sgd_plan
    from fedclock.train.local import Needs

    s = cfg.strategy
    if info.model is None:
        raise ConfigError(f"Strategy '{s.name}' needs the model in BuildInfo.")
    if any(True for _ in info.model.buffers()):
        raise ConfigError(f"Strategy '{s.name}' supports models without buffers (mlp, cnn) only.")
    ratios = FRAGMENT_RATIOS[s.fragments]
    reference = s.mode == "reference"
    units = build_units(info.model, info.layers, "paper")
    initial = {n: p.detach().cpu().clone() for n, p in info.model.named_parameters()}
    layout = Layout.of(info.model, units, info.model_bytes, initial=initial)
    kind = "elements" if reference else "neurons"
    try:
        layout.fragment(ratios, 0, kind)
    except ValueError as exc:
        raise ConfigError(f"Strategy '{s.name}' cannot split this model: {exc}.") from None
    t = cfg.train
    full_plans = [
        local_sgd_plan(int(n), t.batch_size, local_epochs=t.local_epochs, local_steps=t.local_steps)
        for n in info.client_sizes
    ]
    population = info.population
    if population is None:
        raise ConfigError(f"Strategy '{s.name}' needs the population in BuildInfo.")
    costs = np.array([
        [
            population.nominal_timing(
                i, Fragment(j, ratios, kind).cost(layout, plan.samples)
            ).duration
            for j in range(len(ratios))
        ]
        for i, plan in enumerate(full_plans)
    ])  # fmt: skip
    low, offline = k_feasible(costs), k_offline(costs)
    k = offline if s.k is None else s.k
    if s.own("scheduler") == "gre-raa" and k < low:
        raise ConfigError(
            f"strategy.k = {k:g} s is infeasible: some client needs {low:g} s for its cheapest "
            f"fragment (the offline bound is {offline:g} s); set strategy.k ≥ {low:g}."
        )
    planner = FragmentPlanner(
        full_plans=full_plans, layout=layout, ratios=ratios, costs=costs, k=k,
        scheduler=s.own("scheduler"), count=s.count, reference=reference,
    )  # fmt: skip
    trigger, aggregator = _rounds_and_update(
        s, planner, int(sum(int(n) for n in info.client_sizes))
    )
    # the authors' code has no proximal term
    needs = Needs(
        shapes=frozenset({Fragment}), layout=layout, proximal_mu=0.0 if reference else s.rho
    )
    log.info("fedraa: delay bound K = %g s (feasible from %g s, offline bound %g s)", k, low,
             offline)  # fmt: skip
    return Strategy(
        name=s.name, planner=planner, trigger=trigger, aggregator=aggregator, needs=needs
    )
