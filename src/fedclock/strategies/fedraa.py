"""Fed-RAA (Zhang et al., resource-adaptive asynchronous FL of model fragments): the
scheduler math. See ``../shared/specs/fed_raa.md``; the fragments are the
:class:`~fedclock.models.shapes.Fragment` work shape.

- :func:`gre_raa` — Algorithm 2 (App. B): the fragment for an idle client;
- :func:`k_feasible` — the smallest delay bound K for which Algorithm 2 never finds S empty;
- :func:`k_offline` — the offline assignment's bound K (proof of Theorem 2);
- :func:`mix_fragment` — the updater's θ^j ← (1 − α_t)·θ^j + α_t·θ^j_new on the fragment.

The strategy (scheduler, asynchronous trigger, ablations, baselines) is built on these.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


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


def mix_fragment(
    theta: torch.Tensor, new: torch.Tensor, alpha: float, cover: torch.Tensor | bool
) -> torch.Tensor:
    """θ ← (1 − α)·θ + α·θ_new on the elements the fragment covers (Alg. 1's updater),
    computed as θ + α·(θ_new − θ); elements it does not cover keep θ."""
    if cover is False:
        return theta
    step = alpha * (new - theta)
    if isinstance(cover, torch.Tensor):
        step = torch.where(cover, step, torch.zeros_like(step))
    return theta + step
