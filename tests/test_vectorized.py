"""VectorizedExecutor: same contributions as SerialExecutor (float64, tolerance EQUIV_TOL),
fallbacks, blocks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedclock.config import load_config
from fedclock.devices.cost import TaskCost, TaskTiming
from fedclock.experiment import run_experiment
from fedclock.models import build_model
from fedclock.models.shapes import Full, Layout, Suffix, Units, UnsupportedShapeError, WorkShape
from fedclock.sim.types import Contribution, ModelVersion, Task
from fedclock.strategies import local_sgd_plan
from fedclock.train.executor import ClientData, SerialExecutor, snapshot
from fedclock.train.factory import make_executor
from fedclock.train.local import LocalTraining, Needs, step_direction
from fedclock.train.vectorized import (
    VectorizedExecutor,
    auto_max_batch_clients,
    unsupported_model_reason,
)
from tests.conftest import EQUIV_TOL, float64_default, tiny_raw


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread is faster, and immune to a busy machine's scheduling."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(sizes: list[int], shape: tuple[int, ...], seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.split(perm, np.cumsum(sizes)[:-1])
    return ClientData.from_partition(x, y, parts)


def _tasks(
    base: ModelVersion,
    sizes: list[int],
    batch: int,
    *,
    epochs: float | None = None,
    steps: int | None = None,
    first_id: int = 0,
) -> list[Task]:
    out = []
    for c, n in enumerate(sizes):
        plan = local_sgd_plan(n, batch, local_epochs=epochs, local_steps=steps)
        out.append(
            Task(first_id + c, c, 0, base, plan, TaskCost(1.0, 1, 1), TaskTiming(0, 1, 0), 0.0)
        )
    return out


def _assert_same(
    a: list[Contribution],
    b: list[Contribution],
    atol: float | None = None,
    *,
    same_tasks: bool = True,
) -> None:
    """Same contributions: to EQUIV_TOL, computed in float64 (see tests/conftest.py), or to
    an explicit ``atol`` (0: bit for bit)."""
    assert len(a) == len(b)
    tol = EQUIV_TOL if atol is None else atol
    for ca, cb in zip(a, b, strict=True):
        assert ca.task is cb.task or (not same_tasks and ca.task.task_id == cb.task.task_id)
        assert ca.num_samples == cb.num_samples
        assert ca.delta.keys() == cb.delta.keys()
        for k in ca.delta:
            if atol is None:  # the tolerance is float64's: a float32 run is not covered by it
                assert ca.delta[k].dtype == cb.delta[k].dtype == torch.float64
            torch.testing.assert_close(ca.delta[k], cb.delta[k], atol=tol, rtol=tol)
        assert ca.train_loss == pytest.approx(cb.train_loss, abs=tol, rel=tol)


@dataclass(frozen=True)
class Case:
    arch: str
    shape: tuple[int, ...]
    sizes: tuple[int, ...]
    batch: int
    epochs: float | None = 1.0
    steps: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    block: int | None = None
    kw: tuple[tuple[str, object], ...] = ()


CASES = {
    "mlp-unequal-fractional": Case(
        "mlp", (1, 8, 8), (30, 25, 17, 40, 9, 33), 10, epochs=1.5, kw=(("hidden", [16]),)
    ),
    "mlp-momentum-wd": Case(
        "mlp",
        (1, 8, 8),
        (30, 30, 30),
        10,
        epochs=2.0,
        momentum=0.9,
        weight_decay=1e-3,
        kw=(("hidden", [16, 8]),),
    ),
    "logreg-momentum-partial": Case("logreg", (20,), (23, 50, 7, 12), 8, epochs=0.7, momentum=0.5),
    "cnn-blocks-of-2": Case(
        "cnn",
        (1, 8, 8),
        (20, 13, 27, 20, 6),
        6,
        block=2,
        kw=(("channels", [4, 8]), ("fc_hidden", 16), ("kernel_size", 3)),
    ),
    "mlp-local-steps-wraps-epochs": Case(
        "mlp",
        (1, 8, 8),
        (12, 25, 7),
        5,
        epochs=None,
        steps=6,
        weight_decay=1e-2,
        kw=(("hidden", [16]),),
    ),
}


def case_setup(case: Case) -> tuple[ClientData, Any, Any, dict[str, Any]]:
    """(data, model factory, tasks on a base version, executor options) for a case."""
    kw = dict(case.kw)
    data = _data(list(case.sizes), case.shape)

    def model() -> nn.Module:
        return build_model(case.arch, input_shape=case.shape, num_classes=10, seed=1, **kw)  # type: ignore[arg-type]

    def tasks_on(base: ModelVersion) -> list[Task]:
        return _tasks(base, list(case.sizes), case.batch, epochs=case.epochs, steps=case.steps)

    opts = dict(
        seed=5, local=LocalTraining(lr=0.05, momentum=case.momentum, weight_decay=case.weight_decay)
    )
    return data, model, tasks_on, opts


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.usefixtures("float64")
def test_vectorized_matches_serial(name: str) -> None:
    case = CASES[name]
    data, model, tasks_on, opts = case_setup(case)
    base = snapshot(model(), 3)
    tasks = tasks_on(base)
    serial = SerialExecutor(model(), data, **opts).run(tasks)  # type: ignore[arg-type]
    vec = VectorizedExecutor(model(), data, max_batch_clients=case.block, **opts)  # type: ignore[arg-type]
    _assert_same(serial, vec.run(tasks))
    assert all(torch.equal(p, base.params[k]) for k, p in snapshot(model(), 3).params.items())


def _two_versions() -> tuple[nn.Module, ModelVersion, ModelVersion]:
    """A small MLP, its snapshot v0, and v1 = v0 + 0.1 (the model is left at v1)."""
    m = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[8], seed=2)
    v0 = snapshot(m, 0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1)
    return m, v0, snapshot(m, 1)


@pytest.mark.usefixtures("float64")
def test_groups_by_base_version_and_keeps_task_order() -> None:
    sizes = [20, 11, 30, 16]
    data = _data(sizes, (1, 8, 8))
    m, v0, v1 = _two_versions()
    a = _tasks(v0, sizes, 8, epochs=1.0)
    b = _tasks(v1, sizes, 4, epochs=1.0, first_id=10)
    mixed = [a[0], b[1], a[2], b[3], a[1], b[0], a[3], b[2]]
    serial = SerialExecutor(m, data, seed=1, local=LocalTraining(lr=0.1)).run(mixed)
    vec = VectorizedExecutor(m, data, seed=1, local=LocalTraining(lr=0.1), max_batch_clients=3).run(
        mixed
    )
    _assert_same(serial, vec)


@pytest.mark.usefixtures("float64")
def test_tasks_on_different_versions_share_a_block(monkeypatch) -> None:
    """Asynchronous strategies dispatch on many (stale) versions: one block, per-task bases."""
    sizes = [20, 11, 30, 16, 25]
    data = _data(sizes, (1, 8, 8))
    m = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[8], seed=2)
    versions = []
    for v in range(3):
        versions.append(snapshot(m, v))
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * (v + 1))
    tasks = [
        _tasks(versions[c % 3], sizes, 8, epochs=1.0, first_id=0)[c] for c in range(len(sizes))
    ]
    blocks: list[set[int]] = []
    vec = VectorizedExecutor(m, data, seed=1, local=LocalTraining(lr=0.1, momentum=0.5))
    real = vec._run_block
    monkeypatch.setattr(
        vec, "_run_block", lambda ts: blocks.append({t.base.version for t in ts}) or real(ts)
    )
    out = vec.run(tasks)
    assert blocks == [{0, 1, 2}]
    _assert_same(
        SerialExecutor(m, data, seed=1, local=LocalTraining(lr=0.1, momentum=0.5)).run(tasks), out
    )


@pytest.mark.usefixtures("float64")
def test_contribution_does_not_depend_on_block_or_neighbours() -> None:
    sizes = [20, 11, 30, 16, 25]
    data = _data(sizes, (1, 8, 8))
    m = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[8], seed=2)
    tasks = _tasks(snapshot(m, 0), sizes, 8, epochs=1.0)
    whole = VectorizedExecutor(m, data, seed=1, local=LocalTraining(lr=0.1)).run(tasks)
    for min_block in (1, 2):  # a lone task: vmap over one client, or the serial path
        ex = VectorizedExecutor(m, data, seed=1, local=LocalTraining(lr=0.1), min_block=min_block)
        alone = [ex.run([t])[0] for t in reversed(tasks)]
        _assert_same(whole, alone[::-1])


def test_each_contribution_owns_its_delta() -> None:
    sizes = [10, 12, 9]
    data = _data(sizes, (6,))
    m = build_model("logreg", input_shape=(6,), num_classes=10, seed=0)
    out = VectorizedExecutor(m, data, seed=0, local=LocalTraining(lr=0.1)).run(
        _tasks(snapshot(m, 0), sizes, 4, epochs=1.0)
    )
    ptrs = {t.untyped_storage().data_ptr() for c in out for t in c.delta.values()}
    assert len(ptrs) == sum(len(c.delta) for c in out)  # no shared block storage


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    batch=st.integers(1, 12),
    epochs=st.sampled_from([0.3, 1.0, 1.7, 3.0]),
    block=st.integers(1, 4),
    momentum=st.sampled_from([0.0, 0.9]),
)
def test_logreg_property(
    sizes: list[int], batch: int, epochs: float, block: int, momentum: float
) -> None:
    with float64_default():  # not the fixture: hypothesis reruns the body, not the fixture
        data = _data(sizes, (6,), seed=len(sizes))
        m = build_model("logreg", input_shape=(6,), num_classes=10, seed=0)
        tasks = _tasks(snapshot(m, 0), sizes, batch, epochs=epochs)
        serial = SerialExecutor(
            m, data, seed=2, local=LocalTraining(lr=0.1, momentum=momentum)
        ).run(tasks)
        vec = VectorizedExecutor(
            m, data, seed=2, local=LocalTraining(lr=0.1, momentum=momentum), max_batch_clients=block
        )
        _assert_same(serial, vec.run(tasks))


# ------------------------------------------------------------------ fallbacks


class _WithBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def test_model_fallbacks_and_batchnorm_gets_a_vectorized_executor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert unsupported_model_reason(_WithBatchNorm()) is None  # BatchNorm statistics: batched
    no_momentum = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2, momentum=None))
    assert "momentum=None" in (unsupported_model_reason(no_momentum) or "")
    other_buffer = nn.Sequential(nn.Linear(2, 2))
    other_buffer.register_buffer("scale", torch.ones(2))
    assert "buffers" in (unsupported_model_reason(other_buffer) or "")
    assert unsupported_model_reason(nn.Sequential(nn.Linear(2, 2), nn.Dropout())) is not None
    assert unsupported_model_reason(nn.Sequential(nn.Linear(2, 2))) is None
    lstm = build_model("lstm", input_shape=(5,), num_classes=7, lstm_hidden=4, seed=0)
    assert unsupported_model_reason(lstm) is not None  # nn.LSTM: wrong gradients under vmap
    for arch in ("mlp", "cnn", "logreg"):
        shape = (1, 8, 8)
        assert unsupported_model_reason(build_model(arch, input_shape=shape, num_classes=3)) is None
    local, full = LocalTraining(lr=0.1), Needs()

    def make(kind: str, model: nn.Module, shape: tuple[int, ...], **kw: Any) -> Any:
        return make_executor(full, model, _data([8], shape), seed=0, local=local, kind=kind, **kw)

    with caplog.at_level(logging.INFO, logger="fedclock"):
        assert isinstance(make("auto", _WithBatchNorm(), (6,)), VectorizedExecutor)
        fallback = make("auto", other_buffer, (2,))
    assert isinstance(fallback, SerialExecutor)
    assert sum("buffers" in r.getMessage() for r in caplog.records) == 1
    vec = make("auto", nn.Sequential(nn.Flatten(), nn.Linear(6, 10)), (6,), max_batch_clients=4)
    assert isinstance(vec, VectorizedExecutor) and vec.max_batch_clients == 4
    assert isinstance(make("serial", _WithBatchNorm(), (6,)), SerialExecutor)
    with pytest.raises(ValueError, match="allowed"):
        make("spark", _WithBatchNorm(), (6,))
    # partial work goes to the partial-work executor, which needs the model's layout
    with pytest.raises(ValueError, match="layout"):
        make_executor(Needs(shapes=frozenset({Full, Suffix})), _WithBatchNorm(), _data([8], (6,)),
                      seed=0, local=local)  # fmt: skip

    # a shape no executor knows is refused when the executor is built
    @dataclass(frozen=True)
    class Later(WorkShape):
        pass

    with pytest.raises(ValueError, match="Later"):
        make_executor(Needs(shapes=frozenset({Later})), _WithBatchNorm(), _data([8], (6,)),
                      seed=0, local=local)  # fmt: skip


# ------------------------------------------------------------------ BatchNorm


def _vgg() -> nn.Module:
    return build_model("vgg11", input_shape=(3, 32, 32), num_classes=10, seed=1, vgg_width=0.125)


def _assert_same_buffers(
    a: list[Contribution], b: list[Contribution], atol: float = EQUIV_TOL
) -> None:
    for ca, cb in zip(a, b, strict=True):
        assert ca.buffers and ca.buffers.keys() == cb.buffers.keys()
        for k in ca.buffers:
            assert ca.buffers[k].dtype == cb.buffers[k].dtype
            torch.testing.assert_close(ca.buffers[k], cb.buffers[k], atol=atol, rtol=atol)


def _bump(version: ModelVersion, number: int, seed: int) -> ModelVersion:
    """Another version of a model: perturbed parameters and running statistics."""
    g = torch.Generator().manual_seed(seed)
    params = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in version.params.items()}
    buffers = {
        k: v + 7 if v.dtype == torch.int64 else v + 0.1 * torch.rand(v.shape, generator=g)
        for k, v in version.buffers.items()
    }
    return ModelVersion(version=number, params=params, buffers=buffers)


@pytest.mark.parametrize("mixed_versions", [False, True])
@pytest.mark.usefixtures("float64")
def test_batchnorm_vgg_vectorized_matches_serial(
    mixed_versions: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Unequal step counts (local_steps mixed with epochs), momentum and weight decay; each
    client's running statistics (num_batches_tracked included) come back as serial's."""
    sizes = [16, 8, 24, 16, 32]
    data = _data(sizes, (3, 32, 32))
    base = snapshot(_vgg(), 3)
    tasks = _tasks(base, sizes, 8, epochs=1.0)
    tasks[4] = _tasks(base, sizes, 8, steps=5)[4]  # 5 steps: wraps into a second epoch
    if mixed_versions:
        other = _bump(base, 4, seed=0)
        tasks = [
            Task(t.task_id, t.client, 0, other, t.plan, t.cost, t.timing, 0.0) if j % 2 else t
            for j, t in enumerate(tasks)
        ]
    assert sorted(t.plan.local_steps for t in tasks) == [1, 2, 2, 3, 5]
    opts = dict(seed=5, local=LocalTraining(lr=0.05, momentum=0.9, weight_decay=1e-3))
    serial = SerialExecutor(_vgg(), data, **opts).run(tasks)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="fedclock"):
        vec = VectorizedExecutor(_vgg(), data, max_batch_clients=4, **opts)  # type: ignore[arg-type]
        out = vec.run(tasks)
    assert not caplog.records  # nothing ran serially
    _assert_same(serial, out)
    _assert_same_buffers(serial, out)
    assert all(
        int(c.buffers["net.1.num_batches_tracked"])
        == int(c.task.base.buffers["net.1.num_batches_tracked"]) + c.task.plan.local_steps
        for c in out
    )
    # the base versions are left untouched, and each client owns its statistics
    assert all(torch.equal(v, snapshot(_vgg(), 3).buffers[k]) for k, v in base.buffers.items())
    owners = {c.buffers["net.1.running_mean"].untyped_storage().data_ptr() for c in out}
    assert len(owners) == len(out)


@pytest.mark.usefixtures("float64")
def test_batchnorm_tiny_model_matches_serial_with_repeated_runs() -> None:
    sizes = [12, 8, 16]
    data = _data(sizes, (6,))
    torch.manual_seed(0)
    m = _WithBatchNorm()
    tasks = _tasks(snapshot(m, 0), sizes, 4, epochs=2.0)
    serial = SerialExecutor(m, data, seed=0, local=LocalTraining(lr=0.1, momentum=0.5)).run(tasks)
    vec = VectorizedExecutor(m, data, seed=0, local=LocalTraining(lr=0.1, momentum=0.5))
    out = vec.run(tasks) + vec.run(tasks)
    _assert_same(serial + serial, out)
    _assert_same_buffers(serial + serial, out)


@pytest.mark.usefixtures("float64")
def test_batchnorm_padded_batches_and_salf_tasks_run_serially(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sizes = [12, 10, 16, 8]  # B = 4: client 1 (10 samples) has a partial batch
    data = _data(sizes, (6,))
    torch.manual_seed(0)
    m = _WithBatchNorm()
    tasks = _tasks(snapshot(m, 0), sizes, 4, epochs=1.0)
    serial = SerialExecutor(m, data, seed=0, local=LocalTraining(lr=0.1)).run(tasks)
    with caplog.at_level(logging.INFO, logger="fedclock"):
        vec = VectorizedExecutor(m, data, seed=0, local=LocalTraining(lr=0.1))
        out = vec.run(tasks) + vec.run(tasks)
    _assert_same(serial + serial, out)
    _assert_same_buffers(serial + serial, out)
    assert len(caplog.records) == 1 and "padded" in caplog.records[0].getMessage()
    # SALF-family executors (layer map, reference mode, widths) keep BatchNorm models serial
    caplog.clear()
    units = Units(1, {n: 1 for n, _ in m.named_parameters()}, {}, (0.0,), 0.0, (0,))
    with caplog.at_level(logging.INFO, logger="fedclock"):
        salf = VectorizedExecutor(
            m, data, seed=0, local=LocalTraining(lr=0.1), layout=Layout.of(m, units, 0)
        )
        out = salf.run(tasks)
    _assert_same(serial, out, atol=0)
    _assert_same_buffers(serial, out, atol=0)
    assert len(caplog.records) == 1 and "SALF" in caplog.records[0].getMessage()


@dataclass(frozen=True)
class _NewShape(WorkShape):
    """A kind of partial work no executor knows (e.g. a future model fragment)."""

    part: int = 1


def test_an_unknown_work_shape_is_refused_not_trained_fully() -> None:
    from dataclasses import replace

    sizes = [10, 12, 9]
    data = _data(sizes, (6,))
    m = build_model("logreg", input_shape=(6,), num_classes=10, seed=0)
    tasks = _tasks(snapshot(m, 0), sizes, 4, epochs=1.0)
    odd = [tasks[0], replace(tasks[1], plan=replace(tasks[1].plan, shape=_NewShape()))]
    for ex in (
        SerialExecutor(m, data, seed=0, local=LocalTraining(lr=0.1)),
        VectorizedExecutor(m, data, seed=0, local=LocalTraining(lr=0.1)),
    ):
        with pytest.raises(UnsupportedShapeError, match=r"cannot run _NewShape\(part=1\) tasks"):
            ex.run(odd)
    # a strategy that declares it is refused before the run, by make_executor
    from fedclock.train.factory import make_executor
    from fedclock.train.local import Needs

    with pytest.raises(ValueError, match="no executor runs the work shapes _NewShape yet"):
        make_executor(Needs(shapes=frozenset({_NewShape})), m, data, seed=0,
                      local=LocalTraining(lr=0.1))  # fmt: skip


def test_partial_work_runs_from_the_shape_program() -> None:
    """What trains and what is sent come from WorkShape.program, for every shape."""
    from fedclock.models import layer_view
    from fedclock.models.shapes import FULL, Width, build_units

    m = build_model("mlp", input_shape=(6,), num_classes=10, hidden=[8], seed=0)
    units = build_units(m, layer_view(m, (6,)), "paper")
    layout = Layout.of(m, units, 0)
    names = tuple(n for n, _ in m.named_parameters())
    assert FULL.program(layout) == FULL.program(layout, trains_fully=True)
    assert FULL.program(layout).trains == names
    paper, ref = Suffix(2).program(layout), Suffix(2).program(layout, trains_fully=True)
    assert paper.trains == names[2:] and paper.sends == frozenset(names[2:])
    assert ref.trains == names and ref.sends == paper.sends and ref.key == FULL.program(layout).key
    width = Width(0.5).program(layout)
    assert width.scale == 0.5 and width.views is not None
    assert width.views[names[0]] == (slice(0, 4), slice(0, 6))  # 8 hidden units → 4
    with pytest.raises(UnsupportedShapeError, match="No executor knows how to run"):
        _NewShape().program(layout)
    with pytest.raises(UnsupportedShapeError, match="need the model's layout"):
        Suffix(2).program(None)


# ------------------------------------------------------------------ blocks


def test_auto_block_size_bounds_the_largest_stacked_tensor() -> None:
    w1 = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[200, 200], seed=0)
    # 784×200 floats = 627 kB per client: 6 MiB holds 10 clients (docs/benchmarks.md: W1's
    # rounds are fastest at about 10 clients a block on the reference machine)
    assert auto_max_batch_clients(w1, (1, 28, 28), 50) == 10
    w2 = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[32, 16], seed=0)
    assert auto_max_batch_clients(w2, (1, 28, 28), 16) >= 30  # the whole W2 round in one block
    assert auto_max_batch_clients(w1, (1, 28, 28), 50, block_bytes=1) == 1
    with pytest.raises(ValueError, match="max_batch_clients"):
        VectorizedExecutor(
            w1, _data([4], (1, 28, 28)), seed=0, local=LocalTraining(lr=0.1), max_batch_clients=0
        )


# ------------------------------------------------------------------ end to end


def _assert_same_history(a: list[dict], b: list[dict]) -> None:
    """Two float64 runs' evaluations: same rounds at the same virtual times, losses within
    EQUIV_TOL, same accuracies (a prediction flips only between logits 1e-13 apart)."""
    assert len(a) == len(b) > 2
    for ra, rb in zip(a, b, strict=True):
        assert ra["aggregation"] == rb["aggregation"]
        assert ra["virtual_time"] == rb["virtual_time"]
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], abs=EQUIV_TOL, rel=EQUIV_TOL)
        assert ra["test_accuracy"] == rb["test_accuracy"]


@pytest.mark.usefixtures("float64")
def test_the_float64_fixture_runs_whole_experiments_in_float64(tmp_path, monkeypatch) -> None:
    """The end-to-end equivalence tests' tolerance (EQUIV_TOL) holds for float64 runs only."""
    import fedclock.experiment as experiment

    seen: list[torch.dtype] = []
    real = experiment.snapshot

    def spy(model: nn.Module, version: int) -> ModelVersion:
        seen.extend(p.dtype for p in model.parameters())
        return real(model, version)

    monkeypatch.setattr(experiment, "snapshot", spy)
    cfg = load_config(raw=tiny_raw(budget={"aggregations": 1}))
    assert experiment.load_dataset("digits", seed=0).x_train.dtype == torch.float64
    assert run_experiment(cfg, run_dir=tmp_path / "r").summary["status"] == "completed"
    assert seen and set(seen) == {torch.float64}


@pytest.mark.usefixtures("float64")
def test_run_experiment_same_metrics_with_either_executor(tmp_path) -> None:
    results = {}
    for kind in ("serial", "vectorized"):
        raw = tiny_raw(
            executor={"kind": kind},
            train={"local_epochs": 1.5, "batch_size": 16, "lr": 0.1, "momentum": 0.5},
            partition={"scheme": "iid", "num_clients": 6, "sizes": "lognormal"},
        )
        cfg = load_config(raw=raw)
        results[kind] = run_experiment(cfg, run_dir=tmp_path / kind)
    _assert_same_history(results["serial"].history, results["vectorized"].history)
    assert load_config().executor.kind == "auto"


@pytest.mark.usefixtures("float64")
def test_run_experiment_batchnorm_same_metrics_with_either_executor(tmp_path, monkeypatch) -> None:
    """FedAvg on a 1/8-width VGG11 (conv-BN-ReLU) with CIFAR-shaped synthetic data: the
    automatic executor batches the clients (BatchNorm statistics per client) and gives
    serial's metrics (in float64: float32's rounding differences grow through BatchNorm)."""
    blocks: list[int] = []
    real = VectorizedExecutor._run_block

    def spy(self: VectorizedExecutor, tasks: list[Task]) -> list[Contribution]:
        blocks.append(len(tasks))
        return real(self, tasks)

    monkeypatch.setattr(VectorizedExecutor, "_run_block", spy)
    shape = [3, 32, 32]
    synthetic = {"num_samples": 160, "num_classes": 10, "image_shape": shape, "separation": 2.0}
    results = {}
    for kind in ("serial", "auto"):
        raw = tiny_raw(
            executor={"kind": kind},
            data={"name": "synthetic", "synthetic": synthetic},
            model={"arch": "vgg11", "vgg_width": 0.125},
            train={"local_epochs": 1, "batch_size": 8, "lr": 0.01, "momentum": 0.5},
            partition={"scheme": "iid", "num_clients": 4},
            budget={"aggregations": 3},
        )
        cfg = load_config(raw=raw)
        results[kind] = run_experiment(cfg, run_dir=tmp_path / kind)
    assert blocks == [4, 4, 4]  # every round's clients in one block
    _assert_same_history(results["serial"].history, results["auto"].history)


def test_config_max_batch_clients_reaches_the_executor(tmp_path, monkeypatch):
    """executor.max_batch_clients in the config is the block size the run uses."""
    import fedclock.experiment as experiment
    from fedclock.config import load_config
    from tests.conftest import tiny_raw

    built: list[object] = []
    real = experiment.make_executor

    def spy(*args, **kwargs):
        built.append(ex := real(*args, **kwargs))
        return ex

    monkeypatch.setattr(experiment, "make_executor", spy)
    cfg = load_config(raw=tiny_raw(executor={"max_batch_clients": 2}, budget={"aggregations": 1}))
    experiment.run_experiment(cfg, run_dir=tmp_path / "r")
    (ex,) = built
    assert isinstance(ex, VectorizedExecutor) and ex.max_batch_clients == 2


# ------------------------------------------------------------------ batch order
@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_splitmix64_array_equals_the_scalar_mixer(z: int) -> None:
    from fedclock.rng import splitmix64, splitmix64_array

    got = splitmix64_array(np.array([z, z ^ 1], dtype=np.uint64))
    assert [int(v) for v in got] == [splitmix64(z), splitmix64(z ^ 1)]


@given(
    keys=st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=1, max_size=4),
    positions=st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=5),
)
def test_splitmix64_grid_equals_the_scalar_stream(keys: list[int], positions: list[int]) -> None:
    """Draw ``positions[j]`` of the stream of ``keys[i]``, as `splitmix64_at` gives it."""
    from fedclock.rng import splitmix64_at, splitmix64_grid

    got = splitmix64_grid(np.array(keys, dtype=np.uint64), np.array(positions, dtype=np.uint64))
    assert [[int(v) for v in row] for row in got] == [
        [splitmix64_at(k, p) for p in positions] for k in keys
    ]


@given(
    seed=st.integers(min_value=0, max_value=2**40),
    ids=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=8),
)
def test_counter_keys_equal_the_scalar_keys(seed: int, ids: list[tuple[int, int]]) -> None:
    from fedclock.rng import counter_key, counter_keys

    a, b = (np.array(col) for col in zip(*ids, strict=True))
    got = counter_keys(seed, "batches", a, b)
    assert [int(v) for v in got] == [counter_key(seed, "batches", x, y) for x, y in ids]


@given(
    n=st.integers(min_value=1, max_value=40),
    b=st.integers(min_value=1, max_value=12),
    steps=st.integers(min_value=0, max_value=15),
)
def test_batch_positions_are_successive_shuffles(n: int, b: int, steps: int) -> None:
    from fedclock.train.executor import batch_positions, split_batches

    keys = np.array([3, 2**63 + 5, 77], dtype=np.uint64)
    rows = batch_positions(keys, n, steps, b)
    per_epoch = -(-n // b)
    for r, key in enumerate(keys):
        # vectorized over clients = each client alone
        assert np.array_equal(rows[r], batch_positions(np.array([key]), n, steps, b)[0])
        batches = split_batches(torch.from_numpy(rows[r]), n, steps, b)
        assert len(batches) == steps
        assert sum(len(x) for x in batches) == rows.shape[1]
        # every full epoch is a permutation of 0..n−1; a cut epoch is a prefix of its own
        # full permutation (the same order whether or not the epoch is finished)
        for e in range(-(-steps // per_epoch)):
            chunk = rows[r, e * n : (e + 1) * n]
            full = batch_positions(np.array([key]), n, (e + 1) * per_epoch, b)[0, e * n :]
            assert sorted(full.tolist()) == list(range(n))
            assert np.array_equal(chunk, full[: len(chunk)])
    if steps >= per_epoch and n > 3:  # different clients get different orders
        assert not np.array_equal(rows[0, :n], rows[1, :n])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.integers(1, 400),
    take_frac=st.floats(0.0, 1.0),
    dup=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_smallest_draws_equal_the_stable_argsort_prefix(rows, n, take_frac, dup, seed) -> None:
    """The batch order's partial selection is exactly the first `take` of a stable argsort."""
    from fedclock.train.executor import _smallest

    rng = np.random.default_rng(seed)
    u = rng.integers(0, 2**64 - 1, size=(rows, n), dtype=np.uint64, endpoint=True)
    if dup and n > 1:  # equal draws: ties must go by position
        u[:, rng.integers(0, n, n // 2)] = u[:, :1]
    take = max(1, min(n, int(take_frac * n)))
    expected = np.argsort(u, axis=1, kind="stable")[:, :take]
    assert np.array_equal(_smallest(u, take), expected)


@pytest.mark.parametrize(("rows", "n", "take"), [(30, 1666, 16), (200, 1666, 16), (3, 64, 8)])
def test_smallest_draws_in_both_orderings(rows: int, n: int, take: int) -> None:
    """The one-key ordering (rows · threshold fits in 64 bits: W2's 30 clients) and the
    lexsort (200 rows: it does not) give the stable argsort's prefix, ties included."""
    from fedclock.train.executor import _smallest

    rng = np.random.default_rng(rows * n)
    u = rng.integers(0, 2**64 - 1, size=(rows, n), dtype=np.uint64, endpoint=True)
    u[:, 1] = u[:, 0] = np.uint64(5)  # a tie among the smallest: position order
    expected = np.argsort(u, axis=1, kind="stable")[:, :take]
    assert np.array_equal(_smallest(u, take), expected)


@pytest.mark.parametrize("mixed_versions", [False, True])
def test_delta_views_give_the_same_contributions(mixed_versions: bool) -> None:
    """Synchronous rounds share the block's storage as deltas: same values as the copies."""
    sizes = [20, 11, 30, 16]
    data = _data(sizes, (1, 8, 8))
    m, v0, v1 = _two_versions()
    tasks = _tasks(v0, sizes, 8, epochs=1.0)
    if mixed_versions:
        tasks[1] = _tasks(v1, sizes, 8, epochs=1.0)[1]
    opts = dict(seed=5, local=LocalTraining(lr=0.05, momentum=0.5))
    copies = VectorizedExecutor(m, data, **opts).run(tasks)  # type: ignore[arg-type]
    views = VectorizedExecutor(m, data, delta_views=True, **opts).run(tasks)  # type: ignore[arg-type]
    for a, b in zip(copies, views, strict=True):
        assert a.delta.keys() == b.delta.keys()
        assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)
    fresh = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[8], seed=2)
    for k, p in fresh.named_parameters():  # the base snapshot is never written in place
        assert torch.equal(v0.params[k], p.detach())


@pytest.mark.parametrize("delta_views", [False, True])
def test_kept_scratch_buffers_never_reach_a_contribution(delta_views: bool) -> None:
    """The flat step's gradient and batch buffers are kept from block to block
    (``_scratch``): a later block, of the same size or another, leaves the contributions of
    an earlier one as they were, and each block's equal a fresh executor's bit for bit."""
    sizes = [20, 11, 30, 16]
    data = _data(sizes, (1, 8, 8))
    m, v0, v1 = _two_versions()
    opts = dict(seed=5, local=LocalTraining(lr=0.05), delta_views=delta_views)
    ex = VectorizedExecutor(m, data, **opts)  # type: ignore[arg-type]
    first = ex.run(_tasks(v0, sizes, 8, steps=3))
    kept = [{k: d.clone() for k, d in c.delta.items()} for c in first]
    assert set(ex._scratch_bufs) == {"grad", "batch"}  # (the flat step ran)
    for again in (_tasks(v1, sizes, 8, steps=3), _tasks(v1, sizes[:2], 4, steps=2)):
        later = ex.run(again)
        fresh = VectorizedExecutor(m, data, **opts).run(again)  # type: ignore[arg-type]
        for a, b in zip(later, fresh, strict=True):
            assert all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)
    for c, before in zip(first, kept, strict=True):
        assert all(torch.equal(c.delta[k], before[k]) for k in before)


class _TwiceCE:
    """2 × cross-entropy: with plain SGD, the same steps as cross-entropy at twice the lr."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.nn.functional.cross_entropy(output, target)

    def per_sample(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.nn.functional.cross_entropy(output, target, reduction="none")


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_the_loss_is_pluggable(kind: str) -> None:
    sizes = [10, 12, 9]  # 9 and 10 are not multiples of 4: padded rows use per_sample
    data = _data(sizes, (6,))
    m = build_model("logreg", input_shape=(6,), num_classes=10, seed=0).double()
    data = ClientData(data.x.double(), data.y, data.indices)
    tasks = _tasks(snapshot(m, 0), sizes, 4, epochs=1.0)

    def run(local: LocalTraining) -> list[Contribution]:
        return make_executor(Needs(), m, data, seed=0, local=local, kind=kind).run(tasks)

    twice = run(LocalTraining(lr=0.05, loss=_TwiceCE()))
    plain = run(LocalTraining(lr=0.1))
    eps = torch.finfo(torch.float64).eps
    for a, b in zip(plain, twice, strict=True):
        for k in a.delta:
            torch.testing.assert_close(a.delta[k], b.delta[k], atol=1e3 * eps, rtol=1e3 * eps)
        assert b.train_loss == pytest.approx(2 * a.train_loss, rel=1e3 * eps)
    assert any(d.abs().sum() > 0 for d in plain[0].delta.values())


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_proximal_term_is_fedprox_local_objective(kind: str) -> None:
    """Local SGD with proximal_mu = μ takes steps on CE + (μ/2)‖θ − θ_base‖² (FedProx eq. 2),
    checked against autograd on that objective over the same batches, in float64."""
    from fedclock.train.executor import batch_schedule

    sizes, mu, lr, momentum = [12, 9, 16], 0.7, 0.2, 0.5
    data = _data(sizes, (6,))
    data = ClientData(data.x.double(), data.y, data.indices)
    m = build_model("logreg", input_shape=(6,), num_classes=10, seed=0).double()
    base = snapshot(m, 0)
    tasks = _tasks(base, sizes, 4, epochs=2.0)
    local = LocalTraining(lr=lr, momentum=momentum, proximal_mu=mu)
    out = make_executor(Needs(), m, data, seed=0, local=local, kind=kind).run(tasks)
    eps = torch.finfo(torch.float64).eps
    for task, got in zip(tasks, out, strict=True):
        ref = build_model("logreg", input_shape=(6,), num_classes=10, seed=0).double()
        opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=momentum)
        idx = data.indices[task.client]
        for local_rows in batch_schedule(0, task, len(idx)):
            rows = idx[local_rows]
            prox = sum(((p - base.params[n]) ** 2).sum() for n, p in ref.named_parameters())
            loss = nn.functional.cross_entropy(ref(data.x[rows]), data.y[rows]) + 0.5 * mu * prox
            opt.zero_grad()
            loss.backward()
            opt.step()
        for n, p in ref.named_parameters():
            want = p.detach() - base.params[n]
            torch.testing.assert_close(got.delta[n], want, atol=1e4 * eps, rtol=1e4 * eps)
    # the term matters: without it the updates differ
    plain = make_executor(Needs(), m, data, seed=0, local=LocalTraining(lr=lr, momentum=momentum),
                          kind=kind).run(tasks)  # fmt: skip
    assert not torch.allclose(plain[2].delta["net.1.weight"], out[2].delta["net.1.weight"])


@pytest.mark.parametrize("vectorize", [False, True])
def test_contributions_carry_their_coverage(vectorize: bool) -> None:
    """Each contribution says what it covers (its shape's program); outside it Δ = 0."""
    from dataclasses import replace

    from fedclock.models import layer_view
    from fedclock.models.shapes import FULL, Width, build_units
    from tests.conftest import partial_executor

    m = build_model("mlp", input_shape=(6,), num_classes=10, hidden=[8], seed=0)
    units = build_units(m, layer_view(m, (6,)), "paper")
    sizes = [10, 12, 9, 11, 10, 8]
    data = _data(sizes, (6,))
    tasks = _tasks(snapshot(m, 0), sizes, 4, epochs=1.0)
    shapes = [FULL, FULL, Suffix(2), Suffix(2), Width(0.5), Width(0.5)]
    tasks = [replace(t, plan=replace(t.plan, shape=s)) for t, s in zip(tasks, shapes, strict=True)]
    ex = partial_executor(m, data, seed=0, lr=0.1, units=units, vectorize=vectorize)
    names = [n for n, _ in m.named_parameters()]
    for c, shape in zip(ex.run(tasks), shapes, strict=True):
        for n in names:
            cover = c.covers(n)
            if shape is FULL:
                assert c.coverage is None and cover is True
            elif isinstance(shape, Suffix):
                assert cover is (units.of_param[n] >= 2)
            else:  # the width-0.5 submodel: a prefix mask of the tensor
                assert isinstance(cover, torch.Tensor) and cover.shape == c.delta[n].shape
                assert 0 < int(cover.sum()) <= cover.numel()
            outside = ~cover if isinstance(cover, torch.Tensor) else not cover
            if isinstance(outside, torch.Tensor):
                assert torch.count_nonzero(c.delta[n][outside]) == 0
            elif outside:
                assert torch.count_nonzero(c.delta[n]) == 0


class _Doubled:
    """Twice the cross-entropy: a task objective of its own (as an early exit's head)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.nn.functional.cross_entropy(output, target)

    def per_sample(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.nn.functional.cross_entropy(output, target, reduction="none")


@dataclass(frozen=True)
class _OwnLoss(WorkShape):
    """The full model trained on the shape's own loss (Program.loss)."""

    def describe(self) -> str:
        return "own-loss"

    def trains(self, layout, name):  # type: ignore[no-untyped-def]
        return True

    def holds_buffer(self, layout, name):  # type: ignore[no-untyped-def]
        return True

    def _program(self, layout, trains_fully):  # type: ignore[no-untyped-def]
        from fedclock.models.shapes import Program

        names = tuple(layout.param_shapes)
        return Program(trains=names, sends=frozenset(names), loss=_Doubled())


@pytest.mark.parametrize("vectorize", [False, True])
def test_a_shape_brings_its_own_loss(vectorize: bool) -> None:
    """One plain SGD step on 2·CE moves twice as far as on CE, serial and vectorized."""
    from dataclasses import replace

    from fedclock.models import layer_view
    from fedclock.models.shapes import FULL, build_units
    from tests.conftest import partial_executor

    m = build_model("mlp", input_shape=(6,), num_classes=10, hidden=[8], seed=0).double()
    units = build_units(m, layer_view(m, (6,)), "paper")
    sizes = [8, 8, 8, 8]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    tasks = _tasks(snapshot(m, 0), sizes, 8, steps=1)
    shapes = [FULL, FULL, _OwnLoss(), _OwnLoss()]
    tasks = [replace(t, plan=replace(t.plan, shape=s)) for t, s in zip(tasks, shapes, strict=True)]
    # clients 0/2 and 1/3 hold the same rows: equal gradients of CE
    data = replace(data, indices=[data.indices[0], data.indices[1]] * 2)
    ex = partial_executor(m, data, seed=0, lr=0.1, units=units, vectorize=vectorize)
    out = ex.run(tasks)
    for full, own in ((out[0], out[2]), (out[1], out[3])):
        assert own.train_loss == pytest.approx(2 * full.train_loss, rel=1e-12)
        for n, d in full.delta.items():
            torch.testing.assert_close(own.delta[n], 2 * d, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("steps", [[3, 3, 3, 3], [3, 3, 2, 1]])
def test_block_rows_are_each_clients_own_batches(steps: list[int]) -> None:
    """A block's global rows (one gather when nothing is padded, also across clients of two
    sizes, as an IID split's n and n + 1) are each client's ``batch_schedule`` rows; −1 pads."""
    from dataclasses import replace

    from fedclock.train.executor import batch_schedule

    sizes = [17, 16, 17, 16]
    data = _data(sizes, (6,))
    m = build_model("logreg", input_shape=(6,), num_classes=10, seed=0)
    tasks = [
        replace(t, plan=local_sgd_plan(sizes[t.client], 4, local_epochs=None, local_steps=k))
        for t, k in zip(_tasks(snapshot(m, 0), sizes, 4, steps=3), steps, strict=True)
    ]
    ex = make_executor(Needs(), m, data, seed=5, local=LocalTraining(lr=0.1), kind="vectorized")
    rows = ex._rows(tasks, steps, 4)  # type: ignore[attr-defined]
    assert rows.shape == (4, 3, 4)
    for j, task in enumerate(tasks):
        idx = data.indices[task.client]
        want = [idx[local].tolist() for local in batch_schedule(5, task, sizes[task.client])]
        assert len(want) == steps[j]
        for s in range(3):
            got = rows[j, s].tolist()
            assert got == (want[s] if s < steps[j] else [-1] * 4)


@settings(max_examples=40, deadline=None)
@given(
    weight_decay=st.sampled_from([0.0, 1e-3]),
    mu=st.sampled_from([0.0, 0.05]),
    momentum=st.sampled_from([0.0, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_step_direction_is_torch_sgd_and_scratch_changes_no_bit(
    weight_decay: float, mu: float, momentum: float, seed: int
) -> None:
    """Three local steps of ``step_direction`` are torch.optim.SGD's on ∇F + μ(θ − θ_base)
    (FedProx eq. 2), in float64; the allocation-free form (``scratch``) gives the same bits."""
    g = torch.Generator().manual_seed(seed)
    local = LocalTraining(lr=0.1, momentum=momentum, weight_decay=weight_decay, proximal_mu=mu)
    shapes = [(3, 4), (4,)]
    base = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    grads_seq = [[torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
                 for _ in range(3)]  # fmt: skip
    sgd_params = [b.clone().requires_grad_(True) for b in base]
    opt = torch.optim.SGD(sgd_params, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    plain = [b.clone() for b in base]
    inplace = [b.clone() for b in base]
    bufs_p = [torch.zeros_like(b) for b in base]
    bufs_i = [torch.zeros_like(b) for b in base]
    scratch = [torch.empty_like(b) for b in base]
    for grads in grads_seq:
        for p, gr, b in zip(sgd_params, grads, base, strict=True):
            p.grad = gr + mu * (p.detach() - b)  # the proximal term's gradient, by hand
        opt.step()
        d = step_direction(local, [gr.clone() for gr in grads], plain, base, bufs_p)
        torch._foreach_add_(plain, d, alpha=-0.1)
        d = step_direction(local, [gr.clone() for gr in grads], inplace, base, bufs_i, scratch)
        torch._foreach_add_(inplace, d, alpha=-0.1)
        for a, b in zip(plain, inplace, strict=True):
            assert torch.equal(a, b)
        for a, b in zip(plain, sgd_params, strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)
