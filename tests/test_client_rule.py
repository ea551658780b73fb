"""The client-update seam (strategies/client.py, train/local.py's GradientTerm, Task.down,
Contribution.up) and the two methods built on it: SCAFFOLD and FedDyn, each checked against
an independent re-implementation of its paper's Algorithm 1."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.config import load_config
from fedclock.devices.cost import TaskTiming
from fedclock.experiment import _build
from fedclock.sim.simulator import Budget, Simulator
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.client import ClientState
from fedclock.strategies.feddyn import GRAD, DynamicCorrection, FedDynRule
from fedclock.strategies.scaffold import CONTROL, ScaffoldRule
from fedclock.train.executor import ClientData, batch_schedule, load_version, snapshot
from fedclock.train.factory import make_executor
from fedclock.train.local import Linear, LocalTraining, Needs, step_direction
from tests.conftest import EQUIV_TOL, tiny_raw

F64 = dict(rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ the gradient term
@settings(max_examples=30, deadline=None)
@given(
    scale=st.floats(-2, 2), momentum=st.sampled_from([0.0, 0.9]),
    wd=st.sampled_from([0.0, 0.01]), mu=st.sampled_from([0.0, 0.1]), seed=st.integers(0, 99),
)  # fmt: skip
def test_a_linear_term_is_sgd_on_the_objective_with_its_inner_product(
    scale: float, momentum: float, wd: float, mu: float, seed: int
) -> None:
    """Three steps of step_direction with Linear(v, s) are torch.optim.SGD's on
    F(θ) + s·⟨v, θ⟩ + (μ/2)‖θ − θ_base‖² with weight decay λ (float64)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3, 2), (4,)]
    theta0 = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    v = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    target = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]

    def f(ps: list[torch.Tensor]) -> torch.Tensor:  # a smooth non-quadratic loss
        return sum(
            ((p - t) ** 2).sum() + torch.sin(p).sum() for p, t in zip(ps, target, strict=True)
        )  # type: ignore[return-value]

    ref = [p.clone().requires_grad_(True) for p in theta0]
    opt = torch.optim.SGD(ref, lr=0.05, momentum=momentum, weight_decay=wd)
    ours = [p.clone() for p in theta0]
    bufs = [torch.zeros_like(p) for p in theta0]
    local = LocalTraining(lr=0.05, momentum=momentum, weight_decay=wd, proximal_mu=mu,
                          terms=(Linear("v", scale),))  # fmt: skip
    for _ in range(3):
        opt.zero_grad()
        obj = f(ref) + scale * sum((vi * p).sum() for vi, p in zip(v, ref, strict=True))
        obj = obj + mu / 2 * sum(((p - b) ** 2).sum() for p, b in zip(ref, theta0, strict=True))
        obj.backward()
        opt.step()
        q = [p.clone().requires_grad_(True) for p in ours]
        grads = list(torch.autograd.grad(f(q), q))
        d = step_direction(local, grads, ours, theta0, bufs, down={"v": v})
        torch._foreach_add_(ours, d, alpha=-0.05)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b.detach(), **F64)


def test_a_task_without_the_tensors_its_terms_read_is_refused() -> None:
    local = LocalTraining(lr=0.1, terms=(Linear("control"),))
    with pytest.raises(ValueError, match=r"down\['control'\].*client rule attaches"):
        from fedclock.train.local import down_lists

        down_lists(local, {}, ["w"])


# ------------------------------------------------------------------ both executors carry down
def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    ).double()


def _data() -> ClientData:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=gen)
    parts = [np.arange(0, 13), np.arange(13, 27), np.arange(27, 40)]
    return ClientData.from_partition(x, y, parts)


def _tasks(base: ModelVersion, data: ClientData, scale: float) -> list[Task]:
    out = []
    for c in range(len(data.indices)):
        plan = TaskPlan(local_steps=4, batch_size=5, samples=20)
        task = Task(c, c, 0, base, plan, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
        gen = torch.Generator().manual_seed(10 + c)
        task.down = {"v": {n: scale * torch.randn(p.shape, generator=gen, dtype=p.dtype)
                           for n, p in base.params.items()}}  # fmt: skip
        out.append(task)
    return out


def _independent(model: torch.nn.Module, data: ClientData, task: Task, lr: float) -> dict:
    """Plain torch.optim.SGD on CE(θ) + ⟨v, θ⟩ over the task's batches."""
    m = copy.deepcopy(model)
    load_version(m, task.base)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    idx = data.indices[task.client]
    for local in batch_schedule(7, task, len(idx)):
        rows = idx[local]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(data.x[rows]), data.y[rows])
        loss = loss + sum((task.down["v"][n] * p).sum() for n, p in m.named_parameters())
        loss.backward()
        opt.step()
    return {n: p.detach() - task.base.params[n] for n, p in m.named_parameters()}


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_both_executors_add_the_down_tensors_to_every_step(kind: str) -> None:
    model, data = _model(), _data()
    base = snapshot(model, 0)
    tasks = _tasks(base, data, 0.3)
    needs = Needs(synchronous=True, terms=(Linear("v", 1.0),))
    local = LocalTraining(lr=0.1, terms=needs.terms)
    ex = make_executor(needs, copy.deepcopy(model), data, seed=7, local=local, kind=kind)
    got = ex.run(tasks)
    for task, c in zip(tasks, got, strict=True):
        want = _independent(model, data, task, 0.1)
        for n in want:
            torch.testing.assert_close(c.delta[n], want[n], rtol=EQUIV_TOL, atol=EQUIV_TOL)


# ------------------------------------------------------------------ SCAFFOLD, by hand
def _contribution(client: int, down: dict, delta: float, steps: int) -> Contribution:
    base = ModelVersion(0, {"w": torch.tensor([0.0], dtype=torch.float64)})
    task = Task(0, client, 0, base, TaskPlan(steps, 1, steps), None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    task.down = down
    return Contribution(task, {"w": torch.tensor([delta], dtype=torch.float64)}, {}, 1, 0.0)


def test_scaffold_option_ii_hand_computed() -> None:
    """N = 4, η_l = 0.1, K = 2. Round 1 (c = c_i = 0): Δy = (−0.2, 0.4) give
    c_i⁺ = −Δy/(Kη) = (1, −2), c = (1 − 2)/4 = −0.25. Round 2, client 0 (c_0 = 1):
    down = c − c_0 = −1.25; Δy = −0.1 gives c_0⁺ = 1.25 + 0.5 = 1.75, c = −0.25 + 0.75/4."""
    rule = ScaffoldRule(num_clients=4, lr=0.1)
    like = {"w": torch.zeros(1, dtype=torch.float64)}
    t0 = Task(0, 0, 0, ModelVersion(0, like), TaskPlan(2, 1, 2), None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    assert rule.down(t0)[CONTROL]["w"].item() == 0.0
    zero = {CONTROL: {"w": torch.zeros(1, dtype=torch.float64)}}
    rule.on_commit([_contribution(0, zero, -0.2, 2), _contribution(1, zero, 0.4, 2)])
    assert rule.state.get(0, "c_i", like)["w"].item() == pytest.approx(1.0)
    assert rule.state.get(1, "c_i", like)["w"].item() == pytest.approx(-2.0)
    assert rule.c["w"].item() == pytest.approx(-0.25)
    down = rule.down(t0)
    assert down[CONTROL]["w"].item() == pytest.approx(-1.25)
    rule.on_commit([_contribution(0, down, -0.1, 2)])
    assert rule.state.get(0, "c_i", like)["w"].item() == pytest.approx(1.75)
    assert rule.c["w"].item() == pytest.approx(-0.25 + 0.75 / 4)


def test_feddyn_hand_computed() -> None:
    """α = 0.5, m = 4. Client 0's ∇L starts at 0; Δ = 0.2 gives ∇L_0 = −0.1. Server:
    Δ_0 = 0.2, Δ_1 = −0.4 (ω = ½ each): h = 0 − 0.5·(−0.2)/4 = 0.025, the update
    mean − h/α = −0.1 − 0.05 = −0.15."""
    rule = FedDynRule(alpha=0.5)
    like = {"w": torch.zeros(1, dtype=torch.float64)}
    t0 = Task(0, 0, 0, ModelVersion(0, like), TaskPlan(2, 1, 2), None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    down = rule.down(t0)
    assert down[GRAD]["w"].item() == 0.0
    c0 = _contribution(0, down, 0.2, 2)
    c1 = _contribution(1, {GRAD: {"w": torch.zeros(1, dtype=torch.float64)}}, -0.4, 2)
    rule.on_commit([c0])
    assert rule.state.get(0, GRAD, like)["w"].item() == pytest.approx(-0.1)
    norm = DynamicCorrection(alpha=0.5, num_clients=4)
    from fedclock.strategies.aggregators import delta

    upd = norm(c0.task.base, [c0, c1], np.array([0.5, 0.5]), delta)
    assert norm.h["w"].item() == pytest.approx(0.025)
    assert upd["w"].item() == pytest.approx(-0.15)


def test_client_state_is_zero_until_set() -> None:
    s = ClientState()
    like = {"a": torch.ones(2)}
    assert torch.equal(s.get(3, "k", like)["a"], torch.zeros(2))
    s.set(3, "k", {"a": torch.full((2,), 5.0)})
    assert torch.equal(s.get(3, "k", like)["a"], torch.full((2,), 5.0)) and len(s) == 1


# ------------------------------------------------------------------ Algorithm 1, re-implemented
def _simulate(name: str, rounds: int, **strategy):  # type: ignore[no-untyped-def]
    raw = tiny_raw(executor={"threads": 1}, strategy={"name": name, "weights": "uniform", **strategy},
                   budget={"aggregations": rounds}, train={"local_steps": 3, "batch_size": 16,
                   "lr": 0.1, "local_epochs": None})  # fmt: skip
    cfg = load_config(raw=raw)
    parts = _build(cfg, None)
    model = copy.deepcopy(parts.executor.model)
    sim = Simulator(strategy=parts.strategy, executor=parts.executor, population=parts.population,
                    initial=parts.initial, seed=cfg.seed, budget=Budget(aggregations=rounds))  # fmt: skip
    sim.run()
    return cfg, parts, model, sim.model


def _local_sgd(model, data, seed, client, version, x, extra_grad, steps, lr):  # type: ignore[no-untyped-def]
    """K steps of y ← y − η(∇CE(y) + extra_grad(y)) on the client's batches of this round."""
    m = copy.deepcopy(model)
    names = [n for n, _ in m.named_parameters()]
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(x[n])
    idx = data.indices[client]
    plan = TaskPlan(local_steps=steps, batch_size=16, samples=steps * 16)
    task = Task(0, client, 0, ModelVersion(version, x), plan, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    for local in batch_schedule(seed, task, len(idx)):
        rows = idx[local]
        loss = torch.nn.functional.cross_entropy(m(data.x[rows]), data.y[rows])
        grads = torch.autograd.grad(loss, list(m.parameters()))
        with torch.no_grad():
            y = dict(m.named_parameters())
            for n, g in zip(names, grads, strict=True):
                y[n].sub_(lr * (g + extra_grad(n, y[n])))
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def test_scaffold_run_is_algorithm_1_option_ii(float64: None) -> None:
    """Three rounds of the simulator's SCAFFOLD (every client each round, uniform weights,
    η_g = 1) against Alg. 1 written out here with plain tensors."""
    cfg, parts, model, final = _simulate("scaffold", 3)
    data = parts.executor.data
    n_clients, lr, steps = len(data.indices), 0.1, 3
    x = {n: v.clone() for n, v in parts.initial.params.items()}
    zero = {n: torch.zeros_like(v) for n, v in x.items()}
    c, ci = dict(zero), [dict(zero) for _ in range(n_clients)]
    for r in range(3):
        dys, dcs = [], []
        for i in range(n_clients):
            corr = {n: c[n] - ci[i][n] for n in x}
            y = _local_sgd(model, data, cfg.seed, i, r, x, lambda n, _p: corr[n], steps, lr)  # noqa: B023
            new_ci = {n: ci[i][n] - c[n] + (x[n] - y[n]) / (steps * lr) for n in x}
            dys.append({n: y[n] - x[n] for n in x})
            dcs.append({n: new_ci[n] - ci[i][n] for n in x})
            ci[i] = new_ci
        x = {n: x[n] + sum(d[n] for d in dys) / n_clients for n in x}
        c = {n: c[n] + sum(d[n] for d in dcs) / n_clients for n in x}
    for n in x:
        torch.testing.assert_close(final.params[n], x[n], rtol=EQUIV_TOL, atol=EQUIV_TOL)
    assert not torch.allclose(c[next(iter(c))], torch.zeros(1))  # the correction is live


def test_feddyn_run_is_algorithm_1(float64: None) -> None:
    """Three rounds of the simulator's FedDyn (α = 0.05) against Alg. 1 written out here."""
    alpha = 0.05
    cfg, parts, model, final = _simulate("feddyn", 3, feddyn_alpha=alpha)
    data = parts.executor.data
    m, lr, steps = len(data.indices), 0.1, 3
    theta = {n: v.clone() for n, v in parts.initial.params.items()}
    zero = {n: torch.zeros_like(v) for n, v in theta.items()}
    h, grad = dict(zero), [dict(zero) for _ in range(m)]
    for r in range(3):
        locals_ = []
        for i in range(m):

            def extra(n: str, p: torch.Tensor, i: int = i, base: dict = theta) -> torch.Tensor:
                return -grad[i][n] + alpha * (p - base[n])

            y = _local_sgd(model, data, cfg.seed, i, r, theta, extra, steps, lr)
            grad[i] = {n: grad[i][n] - alpha * (y[n] - theta[n]) for n in theta}
            locals_.append(y)
        h = {n: h[n] - alpha / m * sum(y[n] - theta[n] for y in locals_) for n in theta}
        theta = {n: sum(y[n] for y in locals_) / m - h[n] / alpha for n in theta}
    for n in theta:
        torch.testing.assert_close(final.params[n], theta[n], rtol=EQUIV_TOL, atol=EQUIV_TOL)


def test_per_client_momentum_is_the_strategys_state_not_the_executors() -> None:
    """SALF's reference mode keeps each user's momentum across rounds: the buffers live in
    the strategy's ClientState (checkpointed with it), the executor only holds a reference."""
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("golden", REPO / "scripts" / "golden.py")
    assert spec is not None and spec.loader is not None
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    cfg = golden.config_for("salf-reference")
    parts = _build(cfg, None)
    assert parts.strategy.needs.momentum_per_client
    momentum = parts.strategy.client_state.momentum
    executor = parts.executor
    serial = getattr(executor, "_serial_fallback", executor)
    assert serial.momentum_store is momentum and not type(serial).checkpoint_fields
    sim = Simulator(strategy=parts.strategy, executor=executor, population=parts.population,
                    initial=parts.initial, seed=cfg.seed, budget=Budget(aggregations=2))  # fmt: skip
    sim.run()
    assert momentum and all(
        isinstance(t, torch.Tensor) for b in momentum.values() for t in b.values()
    )
