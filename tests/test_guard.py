"""Guarded aggregation (config ``guard``) and fault injection (``population.faults``)."""

from __future__ import annotations

import csv
import json
import math
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.sim.guard import FaultInjector, UpdateGuard, update_norm
from fedclock.sim.types import Contribution


def _contribution(delta: dict[str, torch.Tensor], loss: float = 0.5, client: int = 0):
    task = SimpleNamespace(client=client)
    return Contribution(task=task, delta=delta, buffers={}, num_samples=1, train_loss=loss)  # type: ignore[arg-type]


def test_the_guard_rejects_non_finite_and_too_large_updates() -> None:
    ok = _contribution({"w": torch.tensor([3.0]), "b": torch.tensor([4.0])})  # ‖Δ‖ = 5
    assert update_norm(ok) == 5.0
    assert not UpdateGuard(max_norm=5.0).rejects(ok)
    assert UpdateGuard(max_norm=4.99).rejects(ok)
    nan = _contribution({"w": torch.tensor([1.0, math.nan])})
    inf_loss = _contribution({"w": torch.tensor([1.0])}, loss=math.inf)
    assert UpdateGuard().rejects(nan) and UpdateGuard().rejects(inf_loss)
    assert not UpdateGuard(reject_nonfinite=False).rejects(inf_loss)
    # a finite float32 Δ whose squares overflow float32: the norm is summed in float64
    huge = _contribution({"w": torch.full((4,), 1e30)})
    assert update_norm(huge) == pytest.approx(2e30)
    assert not UpdateGuard().rejects(huge) and UpdateGuard(max_norm=1e29).rejects(huge)


def test_faulty_clients_are_a_seeded_share_and_corrupt_their_updates() -> None:
    faults = FaultInjector(0.2, "nan", 1e6, num_clients=10, seed=4)
    assert int(faults.faulty.sum()) == 2
    assert (faults.faulty == FaultInjector(0.2, "nan", 1e6, 10, 4).faulty).all()
    bad = int(faults.faulty.argmax())
    good = int((~faults.faulty).argmax())
    delta = {"w": torch.tensor([1.0, -2.0])}
    assert faults.apply(_contribution(delta, client=good)).delta["w"].tolist() == [1.0, -2.0]
    assert torch.isnan(faults.apply(_contribution(delta, client=bad)).delta["w"]).all()
    scaled = FaultInjector(0.2, "scale", 1e6, 10, 4).apply(_contribution(delta, client=bad))
    assert scaled.delta["w"].tolist() == [1e6, -2e6]


def _run(tmp_path, name: str, *sets: str) -> tuple[int, str, dict, list[dict]]:
    out = tmp_path / name
    args = ["run", "--preset", "digits-fedavg", "--out", str(out), "-q"]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    summary = json.loads((out / "summary.json").read_text())
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    return result.exit_code, result.output, summary, rows


def test_guarded_aggregation_keeps_a_run_with_nan_clients_on_course(tmp_path) -> None:
    """20 % of the clients send NaN: unguarded, the run stops as diverged (one sentence
    naming the guard, metrics kept); guarded, those updates are rejected and the accuracy
    stays within 2 points of the clean run's."""
    _, _, clean, _ = _run(tmp_path, "clean")
    code, output, diverged, rows = _run(tmp_path, "nan", "population.faults.fraction=0.2")
    assert code != 0 and diverged["status"] == "diverged" and rows
    assert "Traceback" not in output and "guard.reject_nonfinite" in output
    _, _, guarded, rows = _run(
        tmp_path, "guarded", "population.faults.fraction=0.2", "guard.reject_nonfinite=true"
    )
    assert guarded["status"] == "completed"
    faulty = round(0.2 * guarded["num_clients"])
    assert guarded["updates_rejected"] == faulty * guarded["aggregations"]
    assert int(rows[-1]["updates_rejected"]) == guarded["updates_rejected"]
    assert abs(guarded["final_test_accuracy"] - clean["final_test_accuracy"]) <= 0.02


def test_a_norm_bound_rejects_huge_updates_under_an_asynchronous_trigger(tmp_path) -> None:
    """FedAsync (a server step per arrival) with 20 % of the clients sending Δ × 10⁶: the
    norm bound rejects exactly those arrivals, and an arrival rejected alone makes no
    server step."""
    run = ("strategy.name=fedasync", "budget.aggregations=200")
    _, _, clean, _ = _run(tmp_path, "clean", *run)
    code, _, s, _ = _run(
        tmp_path, "async", *run, "population.faults.fraction=0.2",
        "population.faults.kind=scale", "guard.max_update_norm=1000",
    )  # fmt: skip
    assert code == 0 and s["status"] == "completed"
    assert s["updates_rejected"] > 0
    assert s["aggregations"] == s["updates_used"] == 200
    assert s["updates_received"] >= s["updates_used"] + s["updates_rejected"]
    assert s["final_test_accuracy"] >= clean["final_test_accuracy"] - 0.02


def test_a_guard_that_rejects_everything_stops_the_run_in_one_sentence(tmp_path) -> None:
    """Every client faulty: no update is ever accepted, so the run cannot reach its
    aggregation budget; it stops as diverged after 1,000 rejections in a row."""
    code, output, s, rows = _run(
        tmp_path, "all", "population.faults.fraction=1.0", "guard.reject_nonfinite=true",
        "budget.aggregations=5",
    )  # fmt: skip
    assert code == 3 and s["status"] == "diverged" and rows
    assert "The update guard rejected the last 1000 updates in a row" in output
    assert "Traceback" not in output
    assert s["updates_rejected"] == 1000 and s["aggregations"] == 0
