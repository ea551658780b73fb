"""The hand-written MLP gradient (train/mlp_grad.py) against vmap(grad_and_value) of the
module's own cross-entropy, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, grad_and_value, vmap

from fedclock.models import build_model
from fedclock.train.local import CrossEntropy
from fedclock.train.mlp_grad import MlpGrad, mlp_linears


@settings(max_examples=30, deadline=None)
@given(
    hidden=st.lists(st.integers(1, 12), min_size=0, max_size=3),
    clients=st.integers(1, 4),
    batch=st.integers(1, 9),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_mlp_grad_equals_autograd(hidden, clients, batch, weighted, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    model = build_model("mlp", input_shape=(1, 3, 2), num_classes=5, hidden=hidden, seed=seed)
    model = model.double()
    linears = mlp_linears(model)
    assert linears is not None and len(linears) == len(hidden) + 1
    params = {
        n: p.detach().unsqueeze(0).repeat(clients, *[1] * p.dim())
        + 0.3 * torch.randn(clients, *p.shape, generator=g, dtype=torch.float64)
        for n, p in model.named_parameters()
    }
    x = torch.randn(clients, batch, 1, 3, 2, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (clients, batch), generator=g)
    w = torch.rand(clients, batch, generator=g, dtype=torch.float64) if weighted else None

    def loss(p, xb, yb, *wb):
        out = functional_call(model, p, (xb,))
        if wb:
            return (F.cross_entropy(out, yb, reduction="none") * wb[0]).sum()
        return F.cross_entropy(out, yb)

    want_g, want_l = vmap(grad_and_value(loss))(params, x, y, *([w] if weighted else []))
    got_g, got_l = MlpGrad(linears)(params, x, y, w)
    torch.testing.assert_close(got_l, want_l, rtol=1e-12, atol=1e-12)
    assert set(got_g) == set(want_g)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-10, atol=1e-12)


def test_only_plain_mlps_with_cross_entropy_qualify() -> None:
    mlp = build_model("mlp", input_shape=(4,), num_classes=3, hidden=[5], seed=0)
    cnn = build_model("cnn", input_shape=(1, 8, 8), num_classes=3, channels=[2, 2],
                      kernel_size=3, fc_hidden=4, padding="same", seed=0)  # fmt: skip
    assert MlpGrad.applies(mlp, CrossEntropy())
    assert not MlpGrad.applies(cnn, CrossEntropy())
    assert not MlpGrad.applies(mlp, object())
    assert mlp_linears(torch.nn.Linear(3, 2)) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_grad_float32_within_rounding_of_autograd(threads: int) -> None:
    """In float32 the two differ only by rounding (different summation orders)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = build_model("mlp", input_shape=(784,), num_classes=10, hidden=[200], seed=1)
        params = {n: p.detach().unsqueeze(0).repeat(2, *[1] * p.dim())
                  for n, p in model.named_parameters()}  # fmt: skip
        g = torch.Generator().manual_seed(0)
        x = torch.rand(2, 128, 784, generator=g)
        y = torch.randint(0, 10, (2, 128), generator=g)

        def loss(p, xb, yb):
            return F.cross_entropy(functional_call(model, p, (xb,)), yb)

        want_g, want_l = vmap(grad_and_value(loss))(params, x, y)
        got_g, got_l = MlpGrad(mlp_linears(model))(params, x, y)  # type: ignore[arg-type]
        eps = torch.finfo(torch.float32).eps
        torch.testing.assert_close(got_l, want_l, rtol=64 * eps, atol=64 * eps)
        for n in want_g:
            scale = float(want_g[n].abs().max())
            torch.testing.assert_close(got_g[n], want_g[n], rtol=0, atol=1024 * eps * scale)
    finally:
        torch.set_num_threads(old)


def test_full_model_blocks_of_a_plain_mlp_step_by_hand() -> None:
    """FedAvg's full-model tasks on a plain MLP take the hand-written gradient too (so
    test_vectorized's float64 matches against the serial executor cover that path); a CNN
    does not."""
    from fedclock.models.shapes import FULL
    from fedclock.models.zoo import build_model
    from fedclock.train.local import LocalTraining
    from fedclock.train.vectorized import VectorizedExecutor
    from tests.test_vectorized import _data

    data = _data([10, 12], (1, 8, 8))
    local = LocalTraining(lr=0.1)
    mlp = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[8], seed=0)
    assert VectorizedExecutor(mlp, data, seed=0, local=local)._by_hand(FULL)
    cnn = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=0,
                      channels=[4, 8], fc_hidden=16, kernel_size=3)  # fmt: skip
    assert not VectorizedExecutor(cnn, data, seed=0, local=local)._by_hand(FULL)


def test_bound_step_writes_the_gradients_it_returns_unbound() -> None:
    """``Bound.step`` (a block's local steps) fills ``out`` with what an unbound call returns,
    bit for bit, also when the block's size changes between calls (its kept −1 column)."""
    model = build_model("mlp", input_shape=(6,), num_classes=4, hidden=[5, 3], seed=2)
    linears = mlp_linears(model)
    assert linears is not None
    g = torch.Generator().manual_seed(3)
    grad = MlpGrad(linears)
    for clients in (3, 2, 3):
        params = {n: p.detach().unsqueeze(0).repeat(clients, *[1] * p.dim())
                  + 0.1 * torch.randn(clients, *p.shape, generator=g)
                  for n, p in model.named_parameters()}  # fmt: skip
        out = {n: torch.full_like(p, float("nan")) for n, p in params.items()}
        x = torch.randn(clients, 7, 6, generator=g)
        y = torch.randint(0, 4, (clients, 7), generator=g)
        for w in (None, torch.rand(clients, 7, generator=g)):
            want_g, want_l = grad(params, x, y, w)
            got_l = grad.bind(params, out).step(x, y, w)
            assert torch.equal(got_l, want_l)
            for n in want_g:
                assert torch.equal(out[n], want_g[n])
