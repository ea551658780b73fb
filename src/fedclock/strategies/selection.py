"""Client selection: whom a synchronous round asks (docs/methods/selection.md).

A :class:`Selection` chooses a round's m participants among the candidates (the devices
online at the round's start, or every client) and learns from the round's outcome. Without
one, :class:`~fedclock.strategies.triggers.SyncRounds` draws them uniformly (McMahan et al.).
Expected task times come from the cost model (the client's nominal task on its device), and
what a client's data is worth from the statistics its contribution carries up
(:mod:`fedclock.train.statistics`), never from the server looking at client data.

- :class:`Oort` (Lai et al., OSDI'21; FedScale's ``thirdparty/oort``): exploitation by
  statistical utility plus a temporal-uncertainty bonus, penalised by (T/t_i)^α for clients
  slower than the preferred round duration T; T follows a pacer; ε-greedy exploration of
  clients never heard from, ε = max(0.9·0.98^r, 0.3).
- :class:`TiFL` (Chai et al., HPDC'20): latency tiers, one tier per round drawn with
  accuracy-driven probabilities (Alg. 2), credits bounding each tier's rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, Task


class Selection(Protocol):
    """Whom round ``r`` asks: ``select`` returns m of ``candidates`` (sorted client ids);
    ``on_round`` hears the round's used contributions and every task it dispatched;
    ``reads_statistics``: its participants send up their statistics."""

    reads_statistics: ClassVar[bool]

    def setup(self, ctx: Context) -> None: ...

    def select(self, ctx: Context, r: int, candidates: np.ndarray, m: int) -> np.ndarray: ...

    def on_round(
        self, ctx: Context, r: int, used: Sequence[Contribution], tasks: Sequence[Task]
    ) -> None: ...


def expected_durations(ctx: Context, planner: Any) -> np.ndarray:
    """Each client's nominal task duration on its device (download + compute + upload, the
    cost model without the random slowdown): what a server that profiled its fleet knows."""
    pop = ctx.population
    return np.array(
        [pop.nominal_timing(c, planner.nominal(c)[1]).duration for c in range(ctx.num_clients)]
    )


def weighted_sample(rng: np.random.Generator, weights: np.ndarray, k: int) -> np.ndarray:
    """k positions drawn without replacement with probability ∝ ``weights`` at each draw
    (successive sampling, as numpy's ``choice(p=…, replace=False)``), by Efraimidis and
    Spirakis' keys log(u)/w: the k largest, largest first (O(n)). Zero weights come last,
    in position order."""
    n = len(weights)
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    u = rng.random(n)
    live = weights > 0
    with np.errstate(divide="ignore", over="ignore"):
        keys = np.where(live, np.log(u) / np.where(live, weights, 1.0), -np.inf)
    top = np.arange(n) if k == n else np.argpartition(-keys, k - 1)[:k]
    if not live[top].all():  # fewer positive weights than k: zero weights by position
        top = np.concatenate([np.flatnonzero(live), np.flatnonzero(~live)])[:k]
    return top[np.lexsort((top, -keys[top], ~live[top]))]


def top_positions(values: np.ndarray, k: int) -> np.ndarray:
    """The positions of the k largest ``values``, largest first, ties by position (O(n))."""
    n = len(values)
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        kth = np.partition(values, n - k)[n - k]
        above = np.flatnonzero(values > kth)
        at = np.flatnonzero(values == kth)[: k - len(above)]
        top = np.concatenate([above, at])
    else:
        top = np.arange(n)
    return top[np.lexsort((top, -values[top]))]


def _replace_sorted(s: np.ndarray, gone: list[float], add: list[float]) -> np.ndarray:
    """Ascending ``s`` with the values ``gone`` removed (one occurrence each) and ``add``
    inserted: two O(N) passes, not a sort."""
    if gone:
        at = np.searchsorted(s, np.sort(np.array(gone)))
        at += np.arange(len(at)) - np.searchsorted(at, at)  # repeated values
        s = np.delete(s, at)
    if add:
        a = np.sort(np.array(add))
        s = np.insert(s, np.searchsorted(s, a), a)
    return s


# ------------------------------------------------------------------ Oort
def oort_scores(
    reward: np.ndarray,
    duration: np.ndarray,
    time_stamp: np.ndarray,
    cur_round: int,
    *,
    preferred: float,
    penalty: float,
    clip_bound: float,
    norm_rewards: np.ndarray,
    norm_sorted: bool = False,
    uncertainty: float = 0.1,
) -> np.ndarray:
    """Oort's exploitation score of explored clients (FedScale ``getTopK``):

        s_i = (min(R_i, clip) − R_min)/(R_max − R_min) + √(c·ln(r)/L_i),
        s_i ← s_i · (T/t_i)^α  if t_i > T,

    R_i the client's last statistical utility, L_i the round it was last heard from, r the
    current round (from 1), t_i its last duration, T the preferred round duration, c the
    ``uncertainty`` (FedScale's 0.1); the normalisation (clip at the ``clip_bound`` quantile,
    R_min·0.999 and a range ≥ 1e-4: FedScale's guards against a zero range) runs over
    ``norm_rewards`` (the positive rewards of every feasible client; ``norm_sorted``: given
    ascending)."""
    if len(norm_rewards):
        q = min(int(len(norm_rewards) * clip_bound), len(norm_rewards) - 1)
        if norm_sorted:
            clip, least, most = (float(norm_rewards[i]) for i in (q, 0, -1))
        else:
            clip = float(np.partition(norm_rewards, q)[q])  # the sorted list's q-th (O(n))
            least, most = float(norm_rewards.min()), float(norm_rewards.max())
        lo = least * 0.999
        span = max(most - lo, 1e-4)
    else:
        clip, lo, span = math.inf, 0.0, 1.0
    sc = (np.minimum(reward, clip) - lo) / span + np.sqrt(
        uncertainty * math.log(cur_round) / np.maximum(time_stamp, 1)
    )
    slow = duration > preferred
    sc = np.where(slow, sc * (preferred / np.maximum(duration, 1e-4)) ** penalty, sc)
    return np.abs(sc)


class Oort:
    """Oort's training selector over fedclock's rounds (FedScale's defaults).

    Every client is registered at the start with its reward = the samples of one epoch
    (FedScale: min(n_i, steps·B)) and its duration = its nominal task time (the cost model).
    After a round each used contribution sets its client's reward to its statistical utility,
    its duration to the task's duration, its round L_i, and marks it explored.

    Where FedScale's code leaves a case open we chose: when too few unexplored clients are
    online to fill the exploration share, exploitation takes the rest (FedScale re-sends the
    previous round's explored list); a round with no explored client yet takes every slot by
    exploration (FedScale indexes an empty list there); over-commitment (FedScale's 1.3×) is
    not applied here: it is ``selection.over_commit`` (K-of-N rounds, SyncRounds).
    """

    #: its participants send up their statistics (train/statistics.py)
    reads_statistics: ClassVar[bool] = True
    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "reward", "duration", "time_stamp", "count", "exploration", "round_threshold",
        "explore_clients", "exploit_clients", "successful", "exploit_history",
        "explore_history", "last_util_record", "sorted_duration",
    )  # fmt: skip

    def __init__(
        self,
        planner: Any,
        sizes: np.ndarray,
        *,
        exploration_factor: float = 0.9,
        exploration_decay: float = 0.98,
        exploration_min: float = 0.3,
        round_threshold: float = 30.0,
        round_penalty: float = 2.0,
        clip_bound: float = 0.9,
        cut_off_util: float = 0.05,
        pacer_step: int = 20,
        pacer_delta: float = 5.0,
        sample_window: float = 5.0,
        blacklist_rounds: int = -1,
        blacklist_max_len: float = 0.3,
        uncertainty: float = 0.1,
        pacer_flat: float = 0.1,
        pacer_sharp: float = 5.0,
        round_threshold_max: float = 100.0,
        exploit_pool: float = 10.0,
    ) -> None:
        self.planner = planner
        self.sizes = np.asarray(sizes)
        self.exploration_decay = exploration_decay
        self.exploration_min = exploration_min
        self.round_penalty = round_penalty
        self.clip_bound = clip_bound
        self.cut_off_util = cut_off_util
        self.pacer_step = pacer_step
        self.pacer_delta = pacer_delta
        self.sample_window = sample_window
        self.blacklist_rounds = blacklist_rounds
        self.blacklist_max_len = blacklist_max_len
        self.uncertainty = uncertainty
        self.pacer_flat = pacer_flat
        self.pacer_sharp = pacer_sharp
        self.round_threshold_max = round_threshold_max
        self.exploit_pool = exploit_pool
        self.exploration = exploration_factor
        self.round_threshold = round_threshold
        self.reward = np.zeros(0)
        self.duration = np.zeros(0)
        self.time_stamp = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0, dtype=np.int64)
        self.sorted_duration = np.zeros(0)  # every client's duration, ascending (for T)
        self.explore_clients: list[int] = []
        self.exploit_clients: list[int] = []
        self.successful: list[int] = []  # heard from since the last selection
        self.exploit_history: list[float] = []
        self.explore_history: list[float] = []
        self.last_util_record = 0
        # derived, not checkpointed (rebuilt on first use): every client's positive reward,
        # ascending (the normalisation's clip quantile, min and max without a partition);
        # and for one preferred duration T, every client ordered by its exploration value
        # (largest first, ties by id: unexplored clients' values never change)
        self._positive: np.ndarray | None = None
        self._explore_order: tuple[float, np.ndarray, int] | None = None

    def setup(self, ctx: Context) -> None:
        n = ctx.num_clients
        # the samples of one epoch (FedScale registers min(n_i, steps·B))
        samples = np.array([self.planner.nominal(c)[0].samples for c in range(n)])
        self.reward = np.minimum(self.sizes[:n], samples).astype(np.float64)
        self.duration = expected_durations(ctx, self.planner)
        self.sorted_duration = np.sort(self.duration)
        self.time_stamp = np.zeros(n, dtype=np.int64)
        self.count = np.zeros(n, dtype=np.int64)
        self._positive = self._explore_order = None  # (derived from the arrays above)

    # -- the pacer (FedScale ``pacer``): widen T when the exploited utility stalls
    def _pacer(self, cur: int) -> None:
        heard = set(self.successful)

        def mean_util(clients: list[int]) -> float:
            got = [self.reward[c] for c in clients if c in heard]
            return float(sum(got)) / (1e-4 + len(got))

        self.explore_history.append(mean_util(self.explore_clients))
        self.exploit_history.append(mean_util(self.exploit_clients))
        self.successful = []
        step = self.pacer_step
        if cur >= 2 * step and cur % step == 0:
            last = sum(self.exploit_history[-2 * step : -step])
            now = sum(self.exploit_history[-step:])
            if abs(now - last) <= last * self.pacer_flat:  # flat: admit slower clients
                self.round_threshold = min(
                    self.round_threshold_max, self.round_threshold + self.pacer_delta
                )
                self.last_util_record = cur - step
            elif abs(now - last) >= last * self.pacer_sharp:  # sharp: prefer faster ones again
                self.round_threshold = max(
                    self.pacer_delta, self.round_threshold - self.pacer_delta
                )
                self.last_util_record = cur - step

    def preferred_duration(self) -> float:
        """T: the round_threshold-th percentile of every client's duration (inf at 100)."""
        if self.round_threshold >= 100.0:
            return math.inf
        n = len(self.sorted_duration)
        k = min(int(n * self.round_threshold / 100.0), n - 1)
        return float(self.sorted_duration[k])

    def _blacklist(self) -> np.ndarray:
        if self.blacklist_rounds < 0:
            return np.zeros(len(self.count), dtype=bool)
        over = np.flatnonzero(self.count > self.blacklist_rounds)
        over = over[np.argsort(-self.count[over], kind="stable")]
        over = over[: int(self.blacklist_max_len * len(self.count))]
        out = np.zeros(len(self.count), dtype=bool)
        out[over] = True
        return out

    def select(self, ctx: Context, r: int, candidates: np.ndarray, m: int) -> np.ndarray:
        cur = r + 1  # FedScale's rounds count from 1
        self._pacer(cur)
        rng = ctx.rng("oort", r)
        feasible = candidates
        if self.blacklist_rounds >= 0:
            feasible = candidates[~self._blacklist()[candidates]]
        preferred = self.preferred_duration()
        everyone = len(feasible) == len(self.count)  # (the whole population: no gathers)
        unexplored: np.ndarray | None = None  # (None: every client feasible, read the cache)
        if everyone:  # explored ones by id; the positive rewards kept sorted (same values)
            explored = np.flatnonzero(self.count > 0)
            n_unexplored = len(self.count) - len(explored)
            norm = self._positive_rewards()
        else:
            rewards = self.reward[feasible]
            heard = self.count[feasible] > 0
            explored, unexplored = feasible[heard], feasible[~heard]
            n_unexplored = len(unexplored)
            norm = rewards[rewards > 0]
        scores = oort_scores(
            self.reward[explored], self.duration[explored], self.time_stamp[explored], cur,
            preferred=preferred, penalty=self.round_penalty, clip_bound=self.clip_bound,
            norm_rewards=norm, norm_sorted=everyone, uncertainty=self.uncertainty,
        )  # fmt: skip
        self.exploration = max(self.exploration * self.exploration_decay, self.exploration_min)
        explore_len = min(int(m * self.exploration), n_unexplored)
        exploit_len = min(m - explore_len, len(explored))
        explore_len = min(n_unexplored, m - exploit_len)  # (unfilled slots: exploration)
        # exploitation: the clients from the top down to cut_off_util of the exploit_len-th
        # score (and at least the top exploit_pool·exploit_len + 1), sampled ∝ score
        exploit = np.zeros(0, dtype=np.int64)
        if exploit_len > 0:
            n = len(scores)
            if exploit_len < n:
                kth = float(np.partition(scores, n - 1 - exploit_len)[n - 1 - exploit_len])
                pool = scores >= kth * self.cut_off_util
                pool[top_positions(scores, int(self.exploit_pool * exploit_len) + 1)] = True
                where = np.flatnonzero(pool)
            else:
                where = np.arange(n)
            exploit = explored[where[weighted_sample(rng, scores[where], exploit_len)]]
        # exploration: unexplored clients by their (penalised) size, the top
        # sample_window·explore_len of them, sampled ∝ it
        explore = np.zeros(0, dtype=np.int64)
        if explore_len > 0 and unexplored is None:  # the cached order, explored ones skipped
            top = self._top_unexplored(preferred, int(self.sample_window * explore_len))
            init = self._explore_values(top, preferred)
            explore = top[weighted_sample(rng, init, explore_len)]
        elif explore_len > 0:
            assert unexplored is not None
            init = self._explore_values(unexplored, preferred)
            window = top_positions(init, int(self.sample_window * explore_len))
            explore = unexplored[window[weighted_sample(rng, init[window], explore_len)]]
        self.exploit_clients = [int(c) for c in exploit]
        self.explore_clients = [int(c) for c in explore]
        return np.sort(np.concatenate([explore, exploit]).astype(np.int64))

    def _explore_values(self, clients: np.ndarray, preferred: float) -> np.ndarray:
        """An unexplored client's exploration value: its reward (the samples of an epoch),
        times (T/t_i)^α when slower than T (FedScale's ``getTopK``)."""
        init = self.reward[clients].copy()
        d = self.duration[clients]
        slow = d > preferred
        init[slow] *= (preferred / np.maximum(d[slow], 1e-4)) ** self.round_penalty
        return init

    def _top_unexplored(self, preferred: float, k: int) -> np.ndarray:
        """The k unexplored clients of largest exploration value, largest first, ties by id —
        :func:`top_positions` over them — from every client's order for ``preferred``
        (sorted once per T; unexplored clients' values never change), explored ones skipped."""
        cached = self._explore_order
        if cached is None or cached[0] != preferred:
            everyone = np.arange(len(self.count))
            values = self._explore_values(everyone, preferred)
            cached = (preferred, np.lexsort((everyone, -values)), 0)
        _, order, start = cached
        heard = self.count > 0
        while start < len(order) and heard[order[start]]:  # (a fully explored head)
            start += 1
        self._explore_order = (preferred, order, start)
        out: list[np.ndarray] = []
        got, at, chunk = 0, start, max(4 * k, 64)
        while got < k and at < len(order):
            part = order[at : at + chunk]
            part = part[~heard[part]]
            out.append(part)
            got += len(part)
            at += chunk
        return np.concatenate(out)[:k] if out else np.zeros(0, dtype=np.int64)

    def _positive_rewards(self) -> np.ndarray:
        """Every client's positive reward, ascending (kept up to date by :meth:`on_round`)."""
        if self._positive is None:
            self._positive = np.sort(self.reward[self.reward > 0])
        return self._positive

    def on_round(
        self, ctx: Context, r: int, used: Sequence[Contribution], tasks: Sequence[Task]
    ) -> None:
        from fedclock.train.statistics import statistics_of, utility

        old, new = [], []
        gone_r, new_r = [], []  # the positive rewards replaced (for the sorted copy)
        last = {c.client: c for c in used}  # (a client heard twice: its latest update)
        for c in last.values():
            stats = statistics_of(c)
            if stats is None:
                continue
            i = c.client
            before, after = self.reward[i], utility(stats)
            if before > 0:
                gone_r.append(before)
            if after > 0:
                new_r.append(after)
            self.reward[i] = after
            old.append(self.duration[i])
            self.duration[i] = new_d = c.task.timing.duration
            new.append(new_d)
            self.time_stamp[i] = r + 1
            self.count[i] += 1
            self.successful.append(i)
        if old:  # the sorted durations, updated in two O(N) passes (not re-sorted)
            s = self.sorted_duration
            gone = np.searchsorted(s, np.sort(old))
            gone += np.arange(len(gone)) - np.searchsorted(gone, gone)  # repeated values
            s = np.delete(s, gone)
            add = np.sort(np.array(new))
            self.sorted_duration = np.insert(s, np.searchsorted(s, add), add)
        if self._positive is not None and (gone_r or new_r):
            self._positive = _replace_sorted(self._positive, gone_r, new_r)


# ------------------------------------------------------------------ TiFL
def latency_tiers(durations: np.ndarray, tiers: int) -> np.ndarray:
    """Each client's tier 0..k−1 by expected latency, fastest first, equal-count tiers
    (ties by client id): TiFL's profiling groups clients of similar response latency."""
    n = len(durations)
    k = max(1, min(tiers, n))
    order = np.lexsort((np.arange(n), durations))
    out = np.empty(n, dtype=np.int64)
    out[order] = (np.arange(n) * k) // max(n, 1)
    return out


def tifl_probabilities(accuracy: np.ndarray, credits: np.ndarray | None) -> np.ndarray:
    """TiFL's ChangeProbs (Alg. 2): the n tiers with credits left, sorted by accuracy
    ascending, get probabilities n/D, (n−1)/D, …, 1/D with D = n(n+1)/2 (the least accurate
    tier most often); tiers without credits get 0. Ties keep tier order."""
    k = len(accuracy)
    live = np.ones(k, dtype=bool) if credits is None else credits > 0
    if not live.any():
        live = np.ones(k, dtype=bool)
    idx = np.flatnonzero(live)
    order = idx[np.lexsort((idx, accuracy[idx]))]
    n = len(order)
    probs = np.zeros(k)
    probs[order] = (n - np.arange(n)) / (n * (n + 1) / 2)
    return probs


class TiFL:
    """TiFL's adaptive tier selection (Chai et al., HPDC'20, Alg. 2).

    Clients are put in ``tiers`` latency tiers by their nominal task time (the cost model).
    Each round draws one tier with the current probabilities (uniform at first) among the
    tiers with credits left, spends one of its credits, and selects m of its online clients
    uniformly. Every ``interval`` rounds, if the accuracy of the tier selected that round
    did not improve on its accuracy ``interval`` rounds before, the probabilities are set by
    :func:`tifl_probabilities` from every tier's latest accuracy.

    Our choices where the paper leaves room: a tier's accuracy is that of the received model
    on the first-epoch samples of the tier's latest participants (their statistics; the
    paper evaluates each tier's test data every round); a tier with fewer than m online
    clients is topped up from its nearest tiers (faster first); credits default to
    unlimited; a tier never selected yet has accuracy 0 (it is preferred).
    """

    reads_statistics: ClassVar[bool] = True
    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "tier_of", "probs", "credits", "accuracy", "history", "chosen",
    )  # fmt: skip

    def __init__(
        self, planner: Any, *, tiers: int = 5, interval: int = 10, credits: int | None = None
    ) -> None:
        self.planner = planner
        self.tiers = tiers
        self.interval = interval
        self.initial_credits = credits
        self.tier_of = np.zeros(0, dtype=np.int64)
        self.probs = np.zeros(0)
        self.credits: np.ndarray | None = None
        self.accuracy = np.zeros(0)  # each tier's latest accuracy
        self.history: list[list[float]] = []  # the accuracies known at each round
        self.chosen: list[int] = []  # the tier of each round

    def setup(self, ctx: Context) -> None:
        self.tier_of = latency_tiers(expected_durations(ctx, self.planner), self.tiers)
        k = int(self.tier_of.max()) + 1 if len(self.tier_of) else 1
        self.probs = np.full(k, 1.0 / k)
        self.accuracy = np.zeros(k)
        if self.initial_credits is not None:
            self.credits = np.full(k, self.initial_credits, dtype=np.int64)

    def select(self, ctx: Context, r: int, candidates: np.ndarray, m: int) -> np.ndarray:
        k = len(self.probs)
        i = self.interval
        # every I rounds: the tier of the last round did not improve on its accuracy I
        # rounds before → probabilities from every tier's accuracy (Alg. 2, lines 3–5)
        if r % i == 0 and len(self.history) > i:
            t = self.chosen[-1]
            if self.history[-1][t] <= self.history[-1 - i][t]:
                self.probs = tifl_probabilities(self.accuracy, self.credits)
        rng = ctx.rng("tifl", r)
        p = self.probs.copy()
        if self.credits is not None:
            p[self.credits <= 0] = 0.0
        if p.sum() <= 0:  # no tier has credits (or probability) left: every tier
            p = np.ones(k)
        tier = int(rng.choice(k, p=p / p.sum()))
        if self.credits is not None and self.credits[tier] > 0:
            self.credits[tier] -= 1
        self.chosen.append(tier)
        # m online clients of the tier, topped up from the nearest tiers (faster first)
        picked: list[np.ndarray] = []
        need = m
        for t in sorted(range(k), key=lambda t: (abs(t - tier), t)):
            pool = candidates[self.tier_of[candidates] == t]
            if not len(pool):
                continue
            take = min(need, len(pool))
            picked.append(pool[rng.choice(len(pool), size=take, replace=False)])
            need -= take
            if need == 0:
                break
        return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)

    def on_round(
        self, ctx: Context, r: int, used: Sequence[Contribution], tasks: Sequence[Task]
    ) -> None:
        from fedclock.train.statistics import statistics_of

        right = np.zeros(len(self.accuracy))
        seen = np.zeros(len(self.accuracy))
        for c in used:
            stats = statistics_of(c)
            if stats is not None:
                t = self.tier_of[c.client]
                right[t] += stats["correct"]
                seen[t] += stats["samples"]
        heard = seen > 0
        self.accuracy[heard] = right[heard] / seen[heard]
        self.history.append(self.accuracy.tolist())


# ------------------------------------------------------------------ REFL
def refl_priority(next_offline: np.ndarray, now: float, window: float) -> np.ndarray:
    """REFL's IPS priority (``client_manager.getPriority``): online through [t, t + W] but not
    through [t + W, t + 2W] — the devices about to leave, whose data is otherwise rarely
    heard. ``next_offline``: when each candidate next goes offline (inf: never)."""
    return (next_offline >= now + window) & (next_offline < now + 2.0 * window)


class REFL:
    """REFL's Intelligent Participant Selection (Abdelmoniem et al., EuroSys'23;
    ``ahmedcs/REFL``, ``core/client_manager.py::resampleClients``).

    Among the online candidates not asked in the last ``prohibit_reselect`` rounds, the
    priority ones (:func:`refl_priority` over the window W) come first, drawn at random if
    more than m; the rest of the m slots are drawn from the others. W is the round deadline
    (``strategy.t_max``), else a moving average of round durations, W ← (1 − a)·D + a·W
    (``deadline_alpha`` a = 0.25), from the median nominal task time. With
    ``availability_probability`` p > 0, only ⌊p·n⌋ of each list, at random, are seen (the
    authors' model of imperfect prediction).

    Where we chose: REFL's server reads the trace's future availability (an oracle, as
    here: :meth:`Context.next_offline`); a candidate asked recently is left out before the
    draw (REFL replaces it after the draw by a random online client); m clients are taken
    (the authors' code takes one fewer when the list is exactly m long).
    """

    reads_statistics: ClassVar[bool] = False  # (availability and round times only)
    checkpoint_fields: ClassVar[tuple[str, ...]] = ("last_round", "window", "round_start")

    def __init__(
        self,
        planner: Any,
        *,
        t_max: float | None,
        prohibit_reselect: int = 5,
        availability_probability: float = 0.0,
        deadline_alpha: float = 0.25,
    ) -> None:
        self.planner = planner
        self.t_max = t_max
        self.prohibit_reselect = prohibit_reselect
        self.availability_probability = availability_probability
        self.deadline_alpha = deadline_alpha
        self.last_round = np.zeros(0, dtype=np.int64)
        self.window = 0.0 if t_max is None else float(t_max)
        self.round_start = 0.0

    def setup(self, ctx: Context) -> None:
        self.last_round = np.full(ctx.num_clients, -(1 << 40), dtype=np.int64)
        if self.t_max is None:
            self.window = float(np.median(expected_durations(ctx, self.planner)))

    def select(self, ctx: Context, r: int, candidates: np.ndarray, m: int) -> np.ndarray:
        rng = ctx.rng("refl", r)
        self.round_start = ctx.now
        fresh = self.last_round[candidates] < r - self.prohibit_reselect
        if int(fresh.sum()) >= m:
            candidates = candidates[fresh]
        if ctx.has_availability:
            off = np.array([ctx.next_offline(int(c)) for c in candidates])
        else:  # always online: nobody is about to leave
            off = np.full(len(candidates), math.inf)
        prio = refl_priority(off, ctx.now, self.window)
        first, rest = candidates[prio], candidates[~prio]
        p = self.availability_probability
        if p > 0:  # only ⌊p·n⌋ of each list is seen
            first = first[np.sort(rng.permutation(len(first))[: int(p * len(first))])]
            rest = rest[np.sort(rng.permutation(len(rest))[: int(p * len(rest))])]
        if len(first) >= m:
            return np.sort(rng.choice(first, size=m, replace=False))
        fill = rng.choice(rest, size=min(m - len(first), len(rest)), replace=False)
        return np.sort(np.concatenate([first, fill]).astype(np.int64))

    def on_round(
        self, ctx: Context, r: int, used: Sequence[Contribution], tasks: Sequence[Task]
    ) -> None:
        for t in tasks:
            self.last_round[t.client] = r
        if self.t_max is None:  # the moving average of round durations
            a = self.deadline_alpha
            self.window = (1.0 - a) * (ctx.now - self.round_start) + a * self.window


class StaleAwareWeighting:
    """REFL's Staleness-Aware Aggregation (``core/aggregator.py::update_importance``, its
    ``stale_factor`` −4): fresh updates weigh p_i, a stale one (trained on a model τ ≥ 1
    versions old) p_c·s_c with

        s_c = (1 − β)/(τ + 1) + β·(1 − e^{−r_c/r_max} / scale),
        r_c = ‖(u_c + P)/(n + 1) − P/n‖² / ‖P/n‖²,

    u_c the stale model, P/n the mean of the n fresh models (the server's model when none
    is fresh), r_max the largest r_c of the round; the weights are normalised to sum 1 and,
    with the ``mix`` target, average the models (REFL averages the fresh and stale models).
    Defaults: β = 0.35 (``stale_beta``), scale = 10 (``scale_coff``).

    Where we chose: τ counts server versions (REFL counts the rounds the update waited,
    one fewer when it arrives in the round after its deadline); p_i follows
    ``strategy.weights`` (REFL's importance is 1 per update: ``weights: uniform``); the
    authors' code weighs the stale models but never adds them to the model (it sums the
    fresh ones only) — we add them, as the paper describes.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, scheme: str = "samples", *, beta: float = 0.35, scale: float = 10.0):
        self.scheme = scheme
        self.beta = beta
        self.scale = scale

    def __call__(
        self, ctx: Context, base: Any, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        from fedclock.strategies.aggregators import client_importance

        if not contributions:
            return np.zeros(0)
        p = client_importance([c.num_samples for c in contributions], self.scheme)
        tau = np.array([base.version - c.base_version for c in contributions], dtype=np.float64)
        stale = np.flatnonzero(tau > 0)
        if not len(stale):
            return p
        fresh = [c for c in contributions if base.version == c.base_version]
        r = np.array([self._deviation(base, fresh, contributions[int(i)]) for i in stale])
        r_max = float(r.max())
        ratio = r / r_max if r_max > 0 else np.zeros_like(r)
        s = np.ones(len(contributions))
        b = self.beta
        s[stale] = (1 - b) / (tau[stale] + 1) + b * (1 - np.exp(-ratio) / self.scale)
        w = p * s
        return w / w.sum()

    @staticmethod
    def _deviation(base: Any, fresh: Sequence[Contribution], c: Contribution) -> float:
        """r_c = ‖(u_c + P)/(n + 1) − P/n‖² / ‖P/n‖² = ‖u_c − P/n‖² / ((n + 1)²‖P/n‖²)."""
        import torch

        n = len(fresh)
        num = den = 0.0
        for name, theta in base.params.items():
            mean = theta.double()
            if n:
                mean = mean + sum(f.delta[name].double() for f in fresh) / n
            u = c.task.base.params[name].double() + c.delta[name].double()
            num += float(torch.sum((u - mean) ** 2))
            den += float(torch.sum(mean**2))
        return num / ((n + 1) ** 2 * den) if den > 0 else 0.0
