"""The benchmarks' reference loops: the hand-written-gradient floor trains the same model as
the plain serial loop (same batches, same order) to float tolerance, so the "floor" figures
of docs/benchmarks.md time the same work fedclock does."""

from __future__ import annotations

import pytest
import torch

from benchmarks import common


@pytest.mark.parametrize(
    ("hidden", "steps", "epochs", "block"),
    [((8,), None, 2.0, 2), ((12, 6), 1, None, 4), ((5,), 3, None, 3)],
)
def test_the_handwritten_floor_equals_the_plain_serial_loop(
    hidden: tuple[int, ...], steps: int | None, epochs: float | None, block: int
) -> None:
    """Several rounds of several clients, one epoch or more (reshuffled) or a few steps,
    blocks that do and do not divide the clients: the same global model after every round's
    weighted average (float32; relative 1e-4 over a few hundred SGD steps)."""
    torch.manual_seed(0)
    setup = common.FedAvgSetup(
        common.mnist_like(5, 32, num_test=50), hidden=hidden, rounds=3, batch_size=8, lr=0.1,
        local_epochs=epochs, local_steps=steps,
    )  # fmt: skip
    plain: list[torch.Tensor] = []
    hand: list[torch.Tensor] = []
    common.run_plain_serial(setup, final=plain)
    common.run_handwritten(setup, block=block, final=hand)
    assert len(plain) == len(hand) == 2 * (len(hidden) + 1)
    for a, b in zip(plain, hand, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_the_startup_benchmark_reports_each_repeats_ratio(monkeypatch) -> None:
    """`startup` compiles the sources once, before its first run, and gives each repeat's
    fedclock / floor ratio beside the ratio of the medians (runs replaced by fixed figures)."""
    from benchmarks import startup

    compiled: list[str | None] = []
    monkeypatch.setattr(common, "WAIT_FOR_QUIET", False)
    monkeypatch.setattr(startup, "_compile_sources", lambda baseline: compiled.append(baseline))
    walls = {"fedclock": iter([2.0, 3.0, 4.0, 6.0]), "floor": iter([1.0, 2.0, 2.0, 3.0])}

    def fake(kind: str) -> dict[str, float]:
        w = next(walls[kind])
        return {"wall_s": w, "first_round_s": w / 2, "peak_rss_mb": 100.0, "s_per_round": w / 10}

    monkeypatch.setattr(startup, "ROUNDS", {"w2-small": 250})
    monkeypatch.setattr(startup, "run_fedclock", lambda shape, r, w, src=None: fake("fedclock"))
    monkeypatch.setattr(startup, "run_floor", lambda shape, r: fake("floor"))
    monkeypatch.delenv("STARTUP_BASELINE_SRC", raising=False)
    r = startup.run(repeats=4)
    assert compiled == [None]
    assert r["pair_ratios"]["w2-small"]["wall_s"] == pytest.approx([2.0, 1.5, 2.0, 2.0])
    assert r["fedclock_over_floor"]["w2-small"]["wall_s"] == pytest.approx(3.5 / 2.0)
    rows = dict(startup.rows(r))
    assert rows["w2-small: fedclock / floor per repeat"] == "wall 1.50–2.00×, s/round 1.50–2.00×"


def test_the_startup_benchmark_refuses_a_baseline_that_does_not_compile(tmp_path) -> None:
    """The sources are byte-compiled before any run: a baseline fedclock that does not
    compile stops the benchmark before it starts, naming the folder."""
    from benchmarks import startup

    (tmp_path / "fedclock").mkdir()
    (tmp_path / "fedclock" / "__init__.py").write_text("def broken(:\n")
    with pytest.raises(RuntimeError, match="does not byte-compile"):
        startup._compile_sources(str(tmp_path))
