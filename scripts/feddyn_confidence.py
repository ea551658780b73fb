"""Why FedDyn's test loss rises on noniid-mnist while its accuracy keeps rising: the final
model's weight norm and confidence, FedDyn against FedAvg (docs/reproductions/client-drift.md).

    OMP_NUM_THREADS=1 python scripts/feddyn_confidence.py ../shared/data/mnist [SEED]

Runs both strategies for the preset's 400 virtual seconds and prints, for each final model:
‖θ‖₂, test accuracy and loss, and the mean loss and max-softmax confidence on the test
samples it classifies correctly and on those it gets wrong.
"""

from __future__ import annotations

import sys

import torch

from fedclock.config import load_config
from fedclock.experiment import DATA_REUSE, _build
from fedclock.presets import load_preset
from fedclock.sim.simulator import Budget, Simulator
from fedclock.train.executor import load_version


def final_model(name: str, data_dir: str, seed: int) -> tuple[torch.nn.Module, object]:
    raw = load_preset("noniid-mnist")
    raw.pop("compare", None)
    cfg = load_config(
        raw=raw,
        overrides=[f"strategy.name={name}", f"seed={seed}", "executor.threads=1",
                   f"data.data_dir={data_dir}"],
    )  # fmt: skip
    parts = _build(cfg, None)
    sim = Simulator(
        strategy=parts.strategy, executor=parts.executor, population=parts.population,
        initial=parts.initial, seed=cfg.seed, budget=Budget(virtual_time=cfg.budget.virtual_time),
    )  # fmt: skip
    sim.run()
    model = parts.executor.model
    load_version(model, sim.model)
    ds, _ = DATA_REUSE.get(cfg)
    return model, ds


def main() -> None:
    data_dir = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    print("strategy | ‖θ‖₂ | acc (%) | loss | loss right / wrong | confidence right / wrong")
    for name in ("fedavg", "feddyn"):
        model, ds = final_model(name, data_dir, seed)
        model.eval()
        with torch.no_grad():
            out = model(ds.x_test)
            loss = torch.nn.functional.cross_entropy(out, ds.y_test, reduction="none")
            conf = out.softmax(-1).max(-1).values
        right = out.argmax(-1) == ds.y_test
        norm = torch.sqrt(sum((p.detach() ** 2).sum() for p in model.parameters()))
        print(
            f"{name} | {norm:.2f} | {100 * right.float().mean():.2f} | {loss.mean():.3f} | "
            f"{loss[right].mean():.3f} / {loss[~right].mean():.2f} | "
            f"{conf[right].mean():.3f} / {conf[~right].mean():.3f}"
        )


if __name__ == "__main__":
    main()
