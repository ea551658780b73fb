"""fedraa-step: what one local step of a Fed-RAA fragment block costs on this host, part by
part, at ``fedraa-ablation-mnist``'s shapes — the floor under issue 28's speed target.

A block is the tasks of one fragment in one flush: on that preset about two clients, each
training a fragment of the 784-200-10 MLP (20, 40, 60 or 80 hidden units, Table 4) on
batches of 128 images, with momentum 0.5 and the proximal term ρ. For each width the
benchmark times (best of several rounds of many calls, one thread):

- ``step``: the whole local step as ``VectorizedExecutor._train_steps_flat`` takes it — the
  batch gathered from the 60,000 training rows, :class:`~fedclock.train.mlp_grad.MlpGrad`'s
  gradient, :func:`~fedclock.train.local.step_direction` and the update;
- its parts: the gather, the first layer's forward (``baddbmm``) and weight gradient
  (``bmm``) with their GFLOP/s, the optimiser's six element-wise passes over the flat
  buffers, and the log-softmax along the (short) class dim against along dim 1 of the
  transposed view (the form the step uses);
- two alternatives measured and not used: ``torch._fused_sgd_`` for momentum + update (a
  private torch API; whether its values equal the step's bit for bit is recorded).

``peak`` is a 1024³ float32 matrix product, this core's attainable GFLOP/s. Random data of
MNIST's shape (no files needed).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from fedclock.models import build_model
from fedclock.train.local import LocalTraining, step_direction
from fedclock.train.mlp_grad import MlpGrad, mlp_linears

WIDTHS = (20, 40, 60, 80)
CLIENTS, BATCH, ROWS = 2, 128, 60_000
LOCAL = LocalTraining(lr=0.005, momentum=0.5, proximal_mu=0.01)


def _best_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return round(best * 1e6, 1)


def _width(width: int, x_rows: torch.Tensor, batches: torch.Tensor, labels: torch.Tensor,
           g: torch.Generator, calls: int, rounds: int) -> dict[str, object]:  # fmt: skip
    """One block of ``CLIENTS`` fragments of ``width`` hidden units, as the flat path holds
    it (parameters, gradients, momentum, base and the proximal pull in flat buffers)."""
    model = build_model("mlp", input_shape=(784,), num_classes=10, hidden=[width], seed=0)
    linears = mlp_linears(model)
    assert linears is not None
    names = [n for pair in linears for n in pair]
    shapes = [(CLIENTS, *p.shape) for p in model.parameters()]
    sizes = [torch.Size(s).numel() for s in shapes]
    flat = torch.randn(sum(sizes), generator=g) * 0.05
    grads = torch.empty_like(flat)
    base, mom, scratch = flat.clone(), torch.zeros_like(flat), torch.empty_like(flat)
    views = [v.view(s) for v, s in zip(flat.split(sizes), shapes, strict=True)]
    g_views = [v.view(s) for v, s in zip(grads.split(sizes), shapes, strict=True)]
    params, out = dict(zip(names, views, strict=True)), dict(zip(names, g_views, strict=True))
    bound = MlpGrad(linears).bind(params, out)
    xb = torch.empty(CLIENTS * BATCH, 784)
    xb_view = xb.view(CLIENTS, BATCH, 784)
    at = [0]

    def gather() -> int:
        i = at[0] % len(batches)
        at[0] += 1
        torch.index_select(x_rows, 0, batches[i], out=xb)
        return i

    def optimiser() -> None:
        (d,) = step_direction(LOCAL, [grads], [flat], [base], [mom], [scratch])
        flat.add_(d, alpha=-LOCAL.lr)

    def step() -> None:  # _train_steps_flat's loop body
        i = gather()
        bound.step(xb_view, labels[i])
        optimiser()

    def fused() -> None:  # the proximal pull as in step_direction, then one fused kernel
        torch.sub(flat, base, out=scratch)
        scratch.mul_(LOCAL.proximal_mu)
        grads.add_(scratch)
        torch._fused_sgd_(
            [flat], [grads], [mom], weight_decay=0.0, momentum=LOCAL.momentum, lr=LOCAL.lr,
            dampening=0.0, nesterov=False, maximize=False, is_first_step=False,
        )  # fmt: skip

    bound.step(xb_view, labels[gather()])  # a real batch in `xb`, real gradients in `grads`
    w1t = views[0].transpose(1, 2)
    bias = torch.zeros(CLIENTS, 1, width)
    dz = torch.randn(CLIENTS, BATCH, width, generator=g)
    z = torch.randn(CLIENTS, BATCH, 10, generator=g)
    flops = 2 * CLIENTS * BATCH * 784 * width / 1e3  # (÷ µs: GFLOP/s)
    fwd = _best_us(lambda: torch.baddbmm(bias, xb_view, w1t), calls, rounds)
    dw = _best_us(lambda: torch.bmm(dz.transpose(1, 2), xb_view), calls, rounds)
    step_us = _best_us(step, calls, rounds)

    # the same inputs through both optimiser forms: equal bits?
    state = [t.clone() for t in (flat, grads, mom)]
    optimiser()
    ours = [flat.clone(), mom.clone()]
    for t, kept in zip((flat, grads, mom), state, strict=True):
        t.copy_(kept)
    fused()
    fused_equal = torch.equal(ours[0], flat) and torch.equal(ours[1], mom)

    return {
        "step_us": step_us,
        "gather_us": _best_us(gather, calls, rounds),
        "forward_us": fwd,
        "forward_gflops": round(flops / fwd, 1),
        "weight_grad_us": dw,
        "weight_grad_gflops": round(flops / dw, 1),
        "optimiser_us": _best_us(optimiser, calls, rounds),
        "fused_sgd_us": _best_us(fused, calls, rounds),
        "fused_sgd_same_bits": fused_equal,
        "log_softmax_last_dim_us": _best_us(lambda: torch.log_softmax(z, -1), calls, rounds),
        "log_softmax_dim1_us": _best_us(
            lambda: torch.log_softmax(z.transpose(1, 2), 1).transpose(1, 2).contiguous(),
            calls,
            rounds,
        ),
        "flat_floats": flat.numel(),
    }


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    calls, rounds = (20, 2) if quick else (200, 5 * repeats)
    g = torch.Generator().manual_seed(0)
    x_rows = torch.randn(ROWS, 784, generator=g)
    batches = torch.randint(0, ROWS, (512, CLIENTS * BATCH), generator=g)
    labels = torch.randint(0, 10, (ROWS,), generator=g)[batches].view(-1, CLIENTS, BATCH)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    try:
        peak = 2 * 1024**3 / _best_us(lambda: a @ b, max(2, calls // 20), rounds) / 1e3
        widths = {w: _width(w, x_rows, batches, labels, g, calls, rounds) for w in WIDTHS}
    finally:
        torch.set_num_threads(old)
    return {"machine": machine(), "peak_gflops": round(peak, 1), "widths": widths}


def rows(result: dict[str, object]) -> list[tuple[str, str]]:
    out = [("1024³ sgemm (this core's peak)", f"{result['peak_gflops']} GFLOP/s")]
    for width, r in result["widths"].items():  # type: ignore[attr-defined]
        out.append(
            (
                f"{CLIENTS} clients × {width} units",
                f"step {r['step_us']} µs = gather {r['gather_us']} + forward {r['forward_us']} "
                f"({r['forward_gflops']} GFLOP/s) + weight grad {r['weight_grad_us']} "
                f"({r['weight_grad_gflops']} GFLOP/s) + optimiser {r['optimiser_us']} "
                f"(fused SGD {r['fused_sgd_us']}, same bits: {r['fused_sgd_same_bits']}) + rest; "
                f"log-softmax {r['log_softmax_last_dim_us']} → {r['log_softmax_dim1_us']} µs",
            )
        )
    return out
