"""Shared pieces of the benchmarks: data, the fedclock FedAvg runner, the plain-PyTorch
reference loops (a plain serial loop, the hand-written-gradient floor and the ``torch.func``
blocks), timing helpers.

Every runner does the same work per round: each client trains from the global model on its
own data (same model, same lr, same number of steps and batch size), the server takes the
sample-weighted average, and the new global model is evaluated on the test set.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

# fedclock is imported inside the functions that use it, so the plain-PyTorch loops (the
# `startup` benchmark's floor process) can be imported without it

MNIST_SHAPE = (1, 28, 28)


# ------------------------------------------------------------------ data


@dataclass(frozen=True)
class Data:
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    parts: list[np.ndarray]  # each client's row indices

    @property
    def sizes(self) -> list[int]:
        return [len(p) for p in self.parts]


def mnist_like(num_clients: int, per_client: int, *, num_test: int = 10_000, seed: int = 0) -> Data:
    """MNIST-shaped random data (no files): N(0,1) pixels, labels from a random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    n = num_clients * per_client
    x = torch.randn(n + num_test, *MNIST_SHAPE, generator=g)
    teacher = torch.randn(784, 10, generator=g)
    y = (x.view(len(x), -1) @ teacher).argmax(1)
    perm = np.random.default_rng(seed).permutation(n)
    parts = [perm[i * per_client : (i + 1) * per_client] for i in range(num_clients)]
    return Data(x[:n], y[:n], x[n:], y[n:], parts)


def mlp(hidden: Sequence[int], seed: int = 0) -> nn.Module:
    from fedclock.models import build_model

    return build_model(
        "mlp", input_shape=MNIST_SHAPE, num_classes=10, hidden=list(hidden), seed=seed
    )


# ------------------------------------------------------------------ timing

# The clock every figure is read from (the runner's --clock): wall time by default, or this
# process's CPU time (all its threads) — with one thread, CPU time is barely affected by
# other processes sharing the machine, so it is the robust comparison on a busy machine.
CLOCK: Callable[[], float] = time.perf_counter


# The device every training runner uses (the runner's --device): CPU by default; on CUDA the
# data, models and evaluation live on the GPU, and every timed round ends with a read of the
# test metrics, which synchronises the device.
DEVICE = torch.device("cpu")


def clock() -> float:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    return CLOCK()


def on_device(d: Data) -> Data:
    """``d`` with its tensors on :data:`DEVICE` (the client index arrays stay numpy)."""
    return Data(d.x.to(DEVICE), d.y.to(DEVICE), d.x_test.to(DEVICE), d.y_test.to(DEVICE), d.parts)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    cpu = platform.processor() or ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    import os

    gpu = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else None
    return {
        "cpu": cpu,
        "device": str(DEVICE),
        "gpu": gpu,
        "nproc": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


@dataclass(frozen=True)
class FedAvgSetup:
    """One FedAvg workload (W1, W2)."""

    data: Data
    hidden: tuple[int, ...]
    rounds: int
    batch_size: int
    lr: float
    local_epochs: float | None = None
    local_steps: int | None = None

    def steps_for(self, n: int) -> int:
        if self.local_steps is not None:
            return self.local_steps
        assert self.local_epochs is not None
        return max(1, round(self.local_epochs * -(-n // self.batch_size)))


def per_round(times: Sequence[float]) -> float:
    """Seconds per round after the first: the median duration of rounds 2…R.

    ``times`` are wall clocks at the end of each round (evaluation included). The median over
    rounds, rather than the mean, keeps one round hit by another process's burst of CPU from
    moving the figure (the machine is shared; see ``LoadMeter``).
    """
    global last_round_min
    if len(times) < 2:
        return float("nan")
    rounds = np.diff(np.asarray(times)).tolist()
    last_round_min = min(rounds)
    return median(rounds)


last_round_min = float("nan")  # the fastest round of the latest run (the least-disturbed one)


# ------------------------------------------------------------------ fedclock


def run_fedclock(
    setup: FedAvgSetup, executor: str, *, max_batch_clients: int | None = None, seed: int = 0
) -> float:
    """FedAvg through fedclock's simulator (SyncRounds + FedAvg + evaluator); s/round."""
    from types import SimpleNamespace

    from fedclock.devices.population import Population
    from fedclock.models import layer_view, param_bytes
    from fedclock.sim.observers import EvaluationSchedule, Metrics
    from fedclock.sim.simulator import Budget, Simulator
    from fedclock.strategies import LocalSGDPlanner, Strategy, SyncRounds, Update
    from fedclock.train.evaluate import Evaluator
    from fedclock.train.executor import ClientData, SerialExecutor, snapshot
    from fedclock.train.local import LocalTraining
    from fedclock.train.vectorized import VectorizedExecutor

    d = setup.data
    model = mlp(setup.hidden, seed)
    data = ClientData.from_partition(d.x, d.y, d.parts)
    n = len(d.parts)
    population = Population(
        speed=np.full(n, 1.0e9), up_bandwidth=np.full(n, 1.0e7), down_bandwidth=np.full(n, 1.0e7)
    )
    layers = layer_view(model, MNIST_SHAPE)
    planner = LocalSGDPlanner(
        client_sizes=data.sizes(), batch_size=setup.batch_size, local_epochs=setup.local_epochs,
        local_steps=setup.local_steps,
        flops_per_sample=sum(lay.fwd_flops + lay.bwd_flops for lay in layers),
        model_bytes=param_bytes(model),
    )  # fmt: skip
    strategy = Strategy("fedavg", planner, SyncRounds(), Update())
    ex: SerialExecutor | VectorizedExecutor
    if executor == "serial":
        ex = SerialExecutor(model, data, seed=seed, local=LocalTraining(lr=setup.lr), device=DEVICE)
    else:
        ex = VectorizedExecutor(
            model, data, seed=seed, local=LocalTraining(lr=setup.lr), max_batch_clients=max_batch_clients,
            device=DEVICE, delta_views=True,  # as run_experiment sets it for synchronous rounds
        )  # fmt: skip
    evaluator = Evaluator(
        mlp(setup.hidden, seed), d.x_test, d.y_test, batch_size=len(d.y_test), device=DEVICE
    )
    times: list[float] = []
    sim = Simulator(
        strategy=strategy, executor=ex, population=population, initial=snapshot(model, 0),
        seed=seed, budget=Budget(aggregations=setup.rounds),
        observers=[EvaluationSchedule(), Metrics(evaluator),
                   SimpleNamespace(on_evaluation=lambda sim, row: times.append(clock()))],
    )  # fmt: skip
    sim.run()
    # rows: initial evaluation, one per aggregation, and the final one (same model: skipped)
    return per_round(times[1 : setup.rounds + 1])


# ------------------------------------------------------------------ plain PyTorch


@torch.no_grad()
def _metrics(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Test accuracy and mean cross-entropy: what fedclock's Evaluator records every round."""
    acc = float((logits.argmax(1) == y).float().mean())
    return acc, float(F.cross_entropy(logits, y))


def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    return _metrics(model(x), y)


def round_rows(
    gen: torch.Generator, parts: Sequence[torch.Tensor], steps: int, b: int
) -> list[list[torch.Tensor]]:
    """One round's batches: for each client in turn, a fresh shuffle of its rows at each
    epoch start (``torch.randperm`` from ``gen``), cut into batches of ``b`` — the plain
    serial loop's order, which the hand-written floor shares (same batches, same draws)."""
    out = []
    for idx in parts:
        n = len(idx)
        per_epoch = -(-n // b)
        perm = idx
        rows = []
        for s in range(steps):
            if s % per_epoch == 0:
                perm = idx[torch.randperm(n, generator=gen, device=idx.device)]
            rows.append(perm[(s % per_epoch) * b : (s % per_epoch + 1) * b])
        out.append(rows)
    return out


def run_plain_serial(
    setup: FedAvgSetup, *, seed: int = 0, final: list[torch.Tensor] | None = None
) -> float:
    """A plain serial loop: one working model, each client in turn, torch.optim.SGD; s/round.
    ``final``: filled with the last global model's tensors."""
    d = on_device(setup.data)
    model = mlp(setup.hidden, seed).to(DEVICE)
    eval_model = mlp(setup.hidden, seed).to(DEVICE)
    params = list(model.parameters())
    global_params = [p.detach().clone() for p in params]
    sizes = d.sizes
    weights = [n / sum(sizes) for n in sizes]
    parts = [torch.as_tensor(p, device=DEVICE) for p in d.parts]
    gen = torch.Generator(DEVICE).manual_seed(seed)
    times: list[float] = []
    for _ in range(setup.rounds):
        new = [torch.zeros_like(p) for p in global_params]
        batches = round_rows(gen, parts, setup.steps_for(sizes[0]), setup.batch_size)
        for c, rows_c in enumerate(batches):
            with torch.no_grad():
                for p, g in zip(params, global_params, strict=True):
                    p.copy_(g)
            opt = torch.optim.SGD(params, lr=setup.lr)
            model.train()
            for rows in rows_c:
                loss = F.cross_entropy(model(d.x[rows]), d.y[rows])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            with torch.no_grad():
                torch._foreach_add_(new, params, alpha=weights[c])
        global_params = new
        with torch.no_grad():
            for p, g in zip(eval_model.parameters(), global_params, strict=True):
                p.copy_(g)
        _evaluate(eval_model, d.x_test, d.y_test)
        times.append(clock())
    if final is not None:
        final[:] = global_params
    return per_round(times)


def run_handwritten(
    setup: FedAvgSetup,
    *,
    block: int,
    seed: int = 0,
    model: nn.Module | None = None,
    final: list[torch.Tensor] | None = None,
) -> float:
    """The floor: plain PyTorch with a hand-written gradient over blocks of clients; s/round.

    Per block, every step: the forward as one ``baddbmm`` per layer over the block's stacked
    weights, the output error softmax − one-hot (÷ B), one ``bmm`` per weight gradient and per
    propagated error (ReLU's mask), SGD in place; the block's weighted sum folded into the new
    global model by one matrix product per tensor; the test set evaluated every round, layer
    by layer (``F.linear``, ReLU: the forward pass without swapping tensors into a module). The
    batches are the plain serial loop's (:func:`round_rows`: same draws, same order), so the
    two end at the same model to float tolerance (``tests/test_benchmarks.py``). ``model``:
    the MLP (default: fedclock's ``mlp`` of ``setup.hidden``; its (weight, bias) pairs in
    order are what is trained).
    """
    d = on_device(setup.data)
    model = (model if model is not None else mlp(setup.hidden, seed)).to(DEVICE)
    global_params = [p.detach().clone() for p in model.parameters()]
    layers = len(global_params) // 2  # (weight, bias) per Linear
    sizes = d.sizes
    assert len(set(sizes)) == 1, "the floor assumes equal client sizes"
    n, b = sizes[0], setup.batch_size
    steps = setup.steps_for(n)
    assert steps * b <= n or n % b == 0, "the floor assumes full batches"
    parts = [torch.as_tensor(p, device=DEVICE) for p in d.parts]
    total = sum(sizes)
    w_all = torch.tensor([m / total for m in sizes], device=DEVICE)
    x_rows = d.x.reshape(len(d.x), -1)
    x_test_rows = d.x_test.reshape(len(d.x_test), -1)
    gen = torch.Generator(DEVICE).manual_seed(seed)
    lr = setup.lr
    times: list[float] = []
    with torch.no_grad():
        for _ in range(setup.rounds):
            batches = round_rows(gen, parts, steps, b)
            new = [torch.zeros_like(p) for p in global_params]
            for start in range(0, len(parts), block):
                rows = torch.stack([torch.stack(r) for r in batches[start : start + block]])
                c = len(rows)
                ws = [global_params[2 * i].expand(c, *global_params[2 * i].shape).clone()
                      for i in range(layers)]  # fmt: skip
                bs = [global_params[2 * i + 1].expand(c, *global_params[2 * i + 1].shape).clone()
                      for i in range(layers)]  # fmt: skip
                for s in range(steps):
                    r = rows[:, s]  # (c, b)
                    a = x_rows.index_select(0, r.reshape(-1)).view(c, b, -1)
                    inputs, pre = [a], []
                    for i in range(layers):
                        z = torch.baddbmm(bs[i].unsqueeze(1), a, ws[i].transpose(1, 2))
                        pre.append(z)
                        if i < layers - 1:
                            a = torch.relu(z)
                            inputs.append(a)
                    dz = torch.softmax(pre[-1], -1)
                    dz.scatter_add_(-1, d.y[r].unsqueeze(-1), torch.full((c, b, 1), -1.0,
                                                                        device=DEVICE))  # fmt: skip
                    dz.mul_(1.0 / b)
                    for i in range(layers - 1, -1, -1):
                        gw = torch.bmm(dz.transpose(1, 2), inputs[i])
                        gb = dz.sum(1)
                        if i > 0:
                            dz = torch.bmm(dz, ws[i]).mul_(pre[i - 1] > 0)
                        ws[i].add_(gw, alpha=-lr)
                        bs[i].add_(gb, alpha=-lr)
                wb = w_all[start : start + c]
                for i in range(layers):
                    new[2 * i].add_((wb @ ws[i].view(c, -1)).view(new[2 * i].shape))
                    new[2 * i + 1].add_(wb @ bs[i])
            global_params = new
            h = x_test_rows  # the test set through the MLP, layer by layer
            for i in range(layers):
                h = F.linear(h, global_params[2 * i], global_params[2 * i + 1])
                if i < layers - 1:
                    h = torch.relu(h)
            _metrics(h, d.y_test)
            times.append(clock())
    if final is not None:
        final[:] = global_params
    return per_round(times)


def run_floor(
    setup: FedAvgSetup, *, block: int, seed: int = 0, model: nn.Module | None = None
) -> float:
    """``vmap`` blocks (a reference, the floor before :func:`run_handwritten`): a
    ``torch.func`` loop over blocks of clients, fused parameter updates; s/round.

    ``vmap(grad(loss))`` over the block's stacked parameters, one ``_foreach`` update per step,
    the block's weighted sum folded into the new global model with one matrix product per
    tensor. Every client has the same size here, so there is no padding or masking.
    ``model``: the MLP to train (default: fedclock's ``mlp`` of ``setup.hidden``).
    """
    d = on_device(setup.data)
    model = (model if model is not None else mlp(setup.hidden, seed)).to(DEVICE)
    names = [n for n, _ in model.named_parameters()]
    global_params = [p.detach().clone() for p in model.parameters()]

    def loss_fn(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    step = vmap(grad(loss_fn))
    sizes = d.sizes
    assert len(set(sizes)) == 1, "the floor assumes equal client sizes"
    n, b = sizes[0], setup.batch_size
    steps = setup.steps_for(n)
    per_epoch = -(-n // b)
    epochs = -(-steps // per_epoch)
    assert steps * b <= n or n % b == 0, "the floor assumes full batches"
    parts = torch.as_tensor(np.stack(d.parts), device=DEVICE)  # (clients, n)
    w = torch.full((len(sizes),), 1.0 / len(sizes), device=DEVICE)
    gen = torch.Generator(DEVICE).manual_seed(seed)
    times: list[float] = []
    with torch.no_grad():
        for _ in range(setup.rounds):
            new = [torch.zeros_like(p) for p in global_params]
            for start in range(0, len(sizes), block):
                idx = parts[start : start + block]
                c = len(idx)
                if steps * b <= n:  # within the first epoch: a random subset, cut into batches
                    pick = (
                        torch.rand(c, n, generator=gen, device=DEVICE)
                        .topk(steps * b, sorted=False)
                        .indices
                    )
                    rows = torch.gather(idx, 1, pick).view(c, steps, b)
                else:  # successive shuffles
                    perms = torch.argsort(
                        torch.rand(c, epochs, n, generator=gen, device=DEVICE), dim=-1
                    )
                    rows = torch.gather(idx.unsqueeze(1).expand(c, epochs, n), 2, perms)
                    rows = rows.view(c, epochs * per_epoch, b)[:, :steps]
                stacked = [g.expand(c, *g.shape).clone() for g in global_params]
                for s in range(steps):
                    r = rows[:, s]
                    grads = step(dict(zip(names, stacked, strict=True)), d.x[r], d.y[r])
                    torch._foreach_add_(stacked, [grads[k] for k in names], alpha=-setup.lr)
                wb = w[start : start + c]
                for acc, p in zip(new, stacked, strict=True):
                    acc.add_((wb @ p.view(c, -1)).view(acc.shape))
            global_params = new
            state = dict(zip(names, global_params, strict=True))
            logits = functional_call(model, state, (d.x_test,))
            _metrics(logits, d.y_test)
            times.append(clock())
    return per_round(times)


class LoadMeter:
    """CPU used by *other* processes while a benchmark ran (cores, from /proc/stat).

    The benchmarks share the machine with whatever else runs on it; a figure measured while
    other processes kept a core busy is not comparable, so every result records this.
    """

    def __enter__(self) -> LoadMeter:
        self._t0 = time.perf_counter()
        self._busy0 = _busy_ticks()
        self._self0 = _self_ticks()
        self.other_cores = float("nan")
        return self

    def __exit__(self, *exc: object) -> None:
        import os

        wall = time.perf_counter() - self._t0
        busy = _busy_ticks() - self._busy0
        mine = _self_ticks() - self._self0
        if wall > 0 and busy >= 0:
            self.other_cores = max(0.0, (busy - mine) / os.sysconf("SC_CLK_TCK") / wall)


def _busy_ticks() -> float:
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0.0
    return sum(fields[:8]) - idle - steal


def _self_ticks() -> float:
    import os

    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK")


def other_cores_now(window: float = 1.0) -> float:
    """Cores used by other processes over the next ``window`` seconds (this one sleeps)."""
    with LoadMeter() as meter:
        time.sleep(window)
    return meter.other_cores


MAX_TOTAL_WAIT = 3600.0  # seconds of waiting for a quiet machine, over the whole session
_waited = 0.0


def wait_quiet(*, threshold: float = 0.15, windows: int = 2, timeout: float = 600.0) -> float:
    """Wait (at most ``timeout`` s, and within ``MAX_TOTAL_WAIT`` over the session) until other
    processes used < ``threshold`` cores for ``windows`` consecutive 1-s windows; returns the
    seconds waited."""
    global _waited
    t0 = time.perf_counter()
    limit = min(timeout, MAX_TOTAL_WAIT - _waited)
    calm = 0
    while calm < windows and time.perf_counter() - t0 < limit:
        calm = calm + 1 if other_cores_now() < threshold else 0
    waited = time.perf_counter() - t0
    _waited += waited
    return waited


# Set by the runner (--no-wait): measure at once, whatever else runs on the machine.
WAIT_FOR_QUIET = True
MAX_OTHER_CORES = 0.25  # a run during which others used more than this is repeated
MAX_ATTEMPTS = 4


def measure(fn: Callable[[], float]) -> tuple[float, float, int]:
    """(value, other processes' cores during the run, attempts): waits for a quiet machine and
    repeats a run that another process disturbed (at most ``MAX_ATTEMPTS`` times; the last
    attempt is kept whatever happened, and its load is recorded)."""
    value, other = float("nan"), float("nan")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        if WAIT_FOR_QUIET:
            wait_quiet()
        with LoadMeter() as meter:
            value = fn()
        other = meter.other_cores
        if not WAIT_FOR_QUIET or other <= MAX_OTHER_CORES:
            return value, other, attempt
    return value, other, MAX_ATTEMPTS


def interleaved(
    runners: dict[str, Callable[[], float]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every runner ``repeats`` times, interleaved (A B C A B C …), each run on a quiet
    machine where possible (:func:`measure`); also the other processes' cores per run."""
    global round_minima
    out: dict[str, list[float]] = {k: [] for k in runners}
    load: dict[str, list[float]] = {k: [] for k in runners}
    round_minima = {k: [] for k in runners}
    for _ in range(repeats):
        for name, fn in runners.items():
            value, other, _ = measure(fn)
            out[name].append(value)
            load[name].append(round(other, 3))
            round_minima[name].append(last_round_min)
    return out, load


round_minima: dict[str, list[float]] = {}  # per runner: the fastest round of each run


def fedavg_benchmark(
    name: str, setup: FedAvgSetup, *, block: int, repeats: int, quick: bool
) -> dict[str, object]:
    """The five runners of a FedAvg workload, interleaved; medians of s/round and the ratios.
    "floor" is the hand-written-gradient loop (:func:`run_handwritten`), "vmap" the
    ``torch.func`` blocks (:func:`run_floor`, the floor before it), kept as a reference."""
    runners: dict[str, Callable[[], float]] = {
        "plain_serial": lambda: run_plain_serial(setup),
        "floor": lambda: run_handwritten(setup, block=block),
        "vmap": lambda: run_floor(setup, block=block),
        "serial": lambda: run_fedclock(setup, "serial"),
        "vectorized": lambda: run_fedclock(setup, "vectorized"),
    }
    runs, load = interleaved(runners, repeats)
    med = {k: median(v) for k, v in runs.items()}
    d = setup.data
    return {
        "benchmark": name,
        "quick": quick,
        "serial_s_per_round": med["serial"],
        "vectorized_s_per_round": med["vectorized"],
        "plain_serial_s_per_round": med["plain_serial"],
        "floor_s_per_round": med["floor"],
        "vmap_s_per_round": med["vmap"],
        "vectorized_over_floor": med["vectorized"] / med["floor"],
        "vectorized_over_vmap": med["vectorized"] / med["vmap"],
        "serial_over_plain_serial": med["serial"] / med["plain_serial"],
        "plain_serial_over_vectorized": med["plain_serial"] / med["vectorized"],
        "runs_s_per_round": runs,
        "fastest_round_s": {k: min(v) for k, v in round_minima.items()},
        "fastest_round_vectorized_over_floor": min(round_minima["vectorized"])
        / min(round_minima["floor"]),
        "fastest_round_serial_over_plain_serial": min(round_minima["serial"])
        / min(round_minima["plain_serial"]),
        "other_processes_cores": load,
        "config": {
            "clients": len(d.parts),
            "samples_per_client": d.sizes[0],
            "test_samples": len(d.y_test),
            "mlp_hidden": list(setup.hidden),
            "rounds": setup.rounds,
            "batch_size": setup.batch_size,
            "local_epochs": setup.local_epochs,
            "local_steps": setup.local_steps,
            "lr": setup.lr,
            "floor_block": block,
            "repeats": repeats,
        },
        "machine": machine(),
    }


def fedavg_rows(r: dict[str, object]) -> list[tuple[str, str]]:
    f = {k: v for k, v in r.items() if isinstance(v, float)}
    return [
        ("plain serial loop", f"{f['plain_serial_s_per_round']:.4f} s/round"),
        ("floor (hand-written gradient blocks)", f"{f['floor_s_per_round']:.4f} s/round"),
        ("vmap blocks (torch.func, reference)", f"{f['vmap_s_per_round']:.4f} s/round"),
        ("fedclock serial", f"{f['serial_s_per_round']:.4f} s/round"),
        ("fedclock vectorized", f"{f['vectorized_s_per_round']:.4f} s/round"),
        ("vectorized / floor", f"{f['vectorized_over_floor']:.2f}×"),
        ("serial / plain serial", f"{f['serial_over_plain_serial']:.2f}×"),
        ("fastest rounds: vectorized / floor", f"{f['fastest_round_vectorized_over_floor']:.2f}×"),
        (
            "fastest rounds: serial / plain",
            f"{f['fastest_round_serial_over_plain_serial']:.2f}×",
        ),
        ("other processes (cores) per run", json.dumps(r["other_processes_cores"])),
    ]
