"""The server step (strategies/server.py) follows every aggregation of every strategy: with
``strategy.server_optimizer: adam`` each registered strategy gives another run than with
``sgd``, and a server field the strategy does not read is refused."""

from __future__ import annotations

import pytest

from fedclock.config import STRATEGY_OPTIONS, load_config
from fedclock.errors import ConfigError
from fedclock.experiment import run_experiment
from fedclock.strategies import STRATEGIES
from tests.conftest import tiny_raw

# what each strategy needs besides its name to run on tiny_raw (as scripts/golden.py)
_SALF = {"salf": {"scenario": "ratio"}, "population": {"straggler_ratio": 0.5}}
_CIS = {
    "partition": {"num_clients": 7, "sizes": "tree"},
    "model": {"arch": "ee_cnn", "channels": [4, 4, 8]},
    "cis": {"tree": "4-2-1", "serving": "80-15-5"},
}
_NEEDS: dict[str, tuple[dict, dict]] = {
    "fedfix": ({"delta_t": 0.3}, {}),
    "fedbuff": ({"buffer_size": 2}, {}),
    "prunefl": ({"initial_max_rounds": 20}, {}),  # a short initial pruning
    **{n: ({}, _SALF) for n in ("vanilla", "salf", "heterofl", "asyncfl")},
    "drop-stragglers": ({}, _SALF),
    **{n: ({}, _CIS) for n in STRATEGIES if n.startswith("cis-")},
}


def _raw(name: str, **server: object) -> dict:
    strategy, sections = _NEEDS.get(name, ({}, {}))
    return tiny_raw(
        executor={"threads": 1}, budget={"aggregations": 2}, eval={"every_aggregations": 1},
        strategy={"name": name, **strategy, **server}, **sections,
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_applies_its_server_optimizer(tmp_path, name: str) -> None:
    assert "strategy.server_optimizer" in STRATEGY_OPTIONS[name].paths()
    runs = []
    for kind in ("sgd", "adam"):
        cfg = load_config(raw=_raw(name, server_optimizer=kind, server_momentum=0.5))
        res = run_experiment(cfg, run_dir=tmp_path / kind)
        runs.append([row["test_loss"] for row in res.history])
    assert runs[0][0] == runs[1][0]  # the same initial model
    assert runs[0][1:] != runs[1][1:]


def test_salf_server_momentum_changes_the_run(tmp_path) -> None:
    """FedAvgM on SALF's eq. 9 update: the second round differs, the first cannot (v = Δ)."""
    runs = []
    for beta in (0.0, 0.9):
        res = run_experiment(
            load_config(raw=_raw("salf", server_momentum=beta)), run_dir=tmp_path / str(beta)
        )
        runs.append([row["test_loss"] for row in res.history])
    assert runs[0][1] == runs[1][1] and runs[0][2] != runs[1][2]


def test_a_server_field_no_part_reads_is_refused() -> None:
    """--set of a server field the run leaves unread (Adam's τ under sgd) or that the
    strategy has not (FedAsync's step is α, no η_g) is an error naming it."""
    for name, field in (("salf", "server_eps=0.01"), ("cis-serving", "server_beta2=0.9"),
                        ("fedasync", "server_lr=0.5")):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"strategy\.{field.split('=')[0]}"):
            load_config(raw=_raw(name), overrides=[f"strategy.{field}"])
    cfg = load_config(raw=_raw("salf"), overrides=["strategy.server_optimizer=adam",
                                                  "strategy.server_eps=0.01"])  # fmt: skip
    assert cfg.strategy.server_eps == 0.01  # type: ignore[union-attr]
