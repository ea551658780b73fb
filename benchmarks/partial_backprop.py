"""Partial backpropagation: wall time of a depth-d SALF task against d.

A depth-d task (SALF) runs the full forward pass but backpropagates only through the last d
layers (a *layer* holds parameters; ReLU/pooling/flatten are not layers) and updates only
their parameters. Here "depth d" counts the layers trained from the output (d = L is a full
local-SGD step); fedclock's SALF planner numbers the layer where backprop *stops*, so its
``Suffix(depth)`` with depth = L − d + 1. The gradient is fedclock's own
:func:`fedclock.train.executor.suffix_grads` (the prefix's parameters do not require grad, so
no backward graph is recorded for them; ``torch.autograd.grad`` is taken for the suffix
parameters only), or a stand-alone equivalent when that module is absent; the SGD update
touches the suffix only.

Models: fedclock's CNN on MNIST-shaped input (McMahan et al.: 32/64 channels, 5×5, FC 512;
L = 4) and a VGG11-like network defined here (8 conv + 3 FC = 11 layers, no BatchNorm) on
CIFAR-shaped input 3×32×32 — VGG's five 2× poolings need at least 32×32, so MNIST's 28×28 does
not fit it. Inputs are random (no files).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import common
from benchmarks.common import machine, measure, median
from fedclock.models import build_model

try:  # the SALF task's gradient (fedclock.train.executor)
    from fedclock.train.executor import suffix_grads
except ImportError:  # pragma: no cover
    suffix_grads = None

NAME = "partial-backprop"

VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def vgg11(width: float = 1.0, num_classes: int = 10) -> nn.Sequential:
    """VGG11 for 3×32×32 inputs (configuration A of Simonyan & Zisserman), without BatchNorm."""
    layers: list[nn.Module] = []
    c = 3
    for v in VGG11_CFG:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            w = max(1, int(int(v) * width))
            layers += [nn.Conv2d(c, w, 3, padding=1), nn.ReLU()]
            c = w
    fc = max(1, int(512 * width))
    layers += [nn.Flatten(), nn.Linear(c, fc), nn.ReLU(), nn.Linear(fc, fc), nn.ReLU()]
    layers.append(nn.Linear(fc, num_classes))
    return nn.Sequential(*layers)


def split_at_depth(net: nn.Sequential, depth: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(prefix, suffix) of ``net`` such that the suffix holds the last ``depth`` layers."""
    with_params = [i for i, m in enumerate(net) if any(True for _ in m.parameters(recurse=False))]
    if not 1 <= depth <= len(with_params):
        raise ValueError(f"depth must be in 1..{len(with_params)}, got {depth}")
    cut = with_params[len(with_params) - depth]
    return net[:cut], net[cut:]


def depth_step(
    net: nn.Sequential, depth: int, lr: float = 0.05
) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """One SGD step that backpropagates through the last ``depth`` layers only.

    Uses fedclock's own :func:`fedclock.train.executor.suffix_grads` (the SALF task's
    gradient) where it exists, else the stand-alone equivalent below it: the prefix under
    ``torch.no_grad()``, ``torch.autograd.grad`` with respect to the suffix parameters.
    """
    prefix, suffix = split_at_depth(net, depth)
    params = [p for p in suffix.parameters() if p.requires_grad]
    if suffix_grads is not None:
        names = [n for n, _ in suffix.named_parameters()]  # slicing keeps the keys

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            assert suffix_grads is not None
            grads, loss = suffix_grads(net, names, x, y)
            with torch.no_grad():
                torch._foreach_add_(params, [grads[n] for n in names], alpha=-lr)
            return float(loss)

        return step

    def standalone(x: torch.Tensor, y: torch.Tensor) -> float:
        with torch.no_grad():
            h = prefix(x)
        loss = F.cross_entropy(suffix(h), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, list(grads), alpha=-lr)
        return float(loss.detach())

    return standalone


def time_depths(
    net: nn.Sequential, input_shape: tuple[int, ...], *, batch: int, steps: int, repeats: int
) -> tuple[dict[int, float], dict[int, list[float]]]:
    """Median seconds per SGD step at every depth 1..L (interleaved over depths), and the
    other processes' cores during each run."""
    n_layers = sum(1 for m in net if any(True for _ in m.parameters(recurse=False)))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *input_shape, generator=g).to(common.DEVICE)
    y = torch.randint(0, 10, (batch,), generator=g).to(common.DEVICE)
    net.to(common.DEVICE)
    fns = {d: depth_step(net, d) for d in range(1, n_layers + 1)}
    for fn in fns.values():  # warm-up
        fn(x, y)
    runs: dict[int, list[float]] = {d: [] for d in fns}
    loads: dict[int, list[float]] = {d: [] for d in fns}

    def timed(fn: Callable[[torch.Tensor, torch.Tensor], float]) -> float:
        t0 = common.clock()
        for _ in range(steps):
            fn(x, y)
        return (common.clock() - t0) / steps

    for _ in range(repeats):
        for d, fn in fns.items():
            value, other, _ = measure(lambda fn=fn: timed(fn))
            runs[d].append(value)
            loads[d].append(round(other, 3))
    return {d: median(v) for d, v in runs.items()}, loads


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    cnn = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0).net
    vgg = vgg11(width=0.25 if quick else 1.0)
    assert isinstance(cnn, nn.Sequential)
    out: dict[str, object] = {"benchmark": NAME, "quick": quick}
    loads: dict[str, object] = {}
    for name, net, shape, batch, steps in [
        ("cnn", cnn, (1, 28, 28), 50, 3 if quick else 10),
        ("vgg11", vgg, (3, 32, 32), 32, 2 if quick else 4),
    ]:
        t, load = time_depths(net, shape, batch=batch, steps=steps, repeats=repeats)
        loads[name] = {str(d): v for d, v in load.items()}
        full = t[max(t)]
        half = max(t) // 2
        out[name] = {
            "layers": max(t),
            "batch": batch,
            "s_per_step_by_depth": {str(d): v for d, v in t.items()},
            "fraction_of_full_by_depth": {str(d): v / full for d, v in t.items()},
            "half_depth": half,
            "half_depth_fraction_of_full": t[half] / full,
        }
    out["other_processes_cores"] = loads
    out["config"] = {
        "repeats": repeats,
        "vgg11_width": 0.25 if quick else 1.0,
        "gradient": "fedclock.train.executor.suffix_grads"
        if suffix_grads is not None
        else "stand-alone (no_grad prefix + autograd.grad on the suffix)",
    }
    out["machine"] = machine()
    return out


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    for name in ("cnn", "vgg11"):
        m = r[name]
        assert isinstance(m, dict)
        fr = m["fraction_of_full_by_depth"]
        s = m["s_per_step_by_depth"]
        for d in fr:
            lines.append((f"{name} depth {d}/{m['layers']}", f"{s[d] * 1e3:8.2f} ms  {fr[d]:.0%}"))
    lines.append(("other processes (cores) per run", json.dumps(r["other_processes_cores"])))
    return lines
