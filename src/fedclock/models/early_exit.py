"""Early-exit networks (Kaplan et al., §3; specs/reference-implementations.md §3.2).

An :class:`EarlyExitNet` is a flat list of backbone *entries* with an exit head
(AdaptiveAvgPool(1) → Linear, as in the authors' code) after chosen entries.
``forward(x)`` returns every exit's logits, shape ``(B, E, C)``; exit e's loss is
:class:`ExitLoss` ``(e)``, every exit's mean :class:`MultiExitLoss` (what a full-model task
trains). :func:`exit_view` measures each exit's per-sample FLOPs and bytes with
``torch.utils.flop_counter`` (the cost of a task that trains that exit).

Two backbones: ``ee_cnn``, a small residual CNN for MNIST-sized input that trains on two
CPU cores (exits after the stem, the second and the last block), and ``ee_resnet18``, the
authors' ResNet-18 of 17 half-block entries (stage 1 keeps stride 1) with exits after entries
3, 9, 17 (10 classes) or 9, 13, 17 (100 classes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


# ----------------------------------------------------------------------------- losses
@dataclass(frozen=True)
class ExitLoss:
    """Cross-entropy of exit ``exit`` (1-based) of an early-exit network's ``(B, E, C)``
    output: the loss a node minimises when it trains that exit (Algorithm 1, line 6)."""

    exit: int

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output[:, self.exit - 1], target)

    def per_sample(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output[:, self.exit - 1], target, reduction="none")


@dataclass(frozen=True)
class MultiExitLoss:
    """Mean cross-entropy over every exit (a full-model task on an early-exit network)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.per_sample(output, target).mean()

    def per_sample(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        b, e, c = output.shape
        ce = F.cross_entropy(
            output.reshape(b * e, c), target.repeat_interleave(e), reduction="none"
        )
        return ce.view(b, e).mean(1)


# ----------------------------------------------------------------------------- model
class EarlyExitNet(nn.Module):
    """Backbone ``entries`` with an exit head after each entry of ``exits`` (1-based entry
    indices, increasing); ``head_channels[k]`` is the channel count entering head k, which
    pools it to ``head_pool`` × ``head_pool`` (1 in the authors' ResNet) before its linear
    layer."""

    def __init__(
        self, arch: str, input_shape: tuple[int, ...], num_classes: int,
        entries: Sequence[nn.Module], exits: Sequence[int], head_channels: Sequence[int],
        head_pool: int = 1,
    ) -> None:  # fmt: skip
        super().__init__()
        if list(exits) != sorted(set(exits)) or exits[0] < 1 or exits[-1] > len(entries):
            raise ValueError(f"exits must be increasing entry indices in 1..{len(entries)}")
        self.arch = arch
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.input_dtype = torch.float32
        self.exits = tuple(exits)
        self.entries = nn.ModuleList(entries)
        self.heads = nn.ModuleList(
            nn.Sequential(
                nn.AdaptiveAvgPool2d(head_pool),
                nn.Flatten(),
                nn.Linear(c * head_pool * head_pool, num_classes),
            )
            for c in head_channels
        )

    @property
    def num_exits(self) -> int:
        return len(self.exits)

    def forward(self, x: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """Logits of exits 1..``upto`` (all by default), shape ``(B, upto, C)``."""
        last = self.num_exits if upto is None else upto
        outs = []
        h: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = x
        k = 0
        for i, entry in enumerate(self.entries, start=1):
            h = entry(h)
            if i == self.exits[k]:
                feat = h[0] if isinstance(h, tuple) else h  # after an "L" half-block: its output
                outs.append(self.heads[k](feat))
                k += 1
                if k == last:
                    break
        return torch.stack(outs, 1)

    def exit_params(self, e: int) -> tuple[str, ...]:
        """Names of the parameters exit ``e`` uses: the entries up to it and its head."""
        upto = self.exits[e - 1]
        keep = (*tuple(f"entries.{i}." for i in range(upto)), f"heads.{e - 1}.")
        return tuple(n for n, _ in self.named_parameters() if n.startswith(keep))

    def exit_buffers(self, e: int) -> tuple[str, ...]:
        upto = self.exits[e - 1]
        keep = tuple(f"entries.{i}." for i in range(upto))
        return tuple(n for n, _ in self.named_buffers() if n.startswith(keep))


@dataclass(frozen=True)
class ExitInfo:
    """Per exit (index e − 1): the parameters and buffers it uses, its per-sample forward
    and backward FLOPs (the ``flop_counter`` convention of :mod:`fedclock.models.layers`),
    and the bytes of its parameters."""

    params: tuple[tuple[str, ...], ...]
    buffers: tuple[tuple[str, ...], ...]
    fwd_flops: tuple[float, ...]
    bwd_flops: tuple[float, ...]
    param_bytes: tuple[int, ...]

    @property
    def flops_ratio(self) -> tuple[float, ...]:
        """Forward FLOPs of the model up to each exit relative to the last (FLOPS Prop's r_e)."""
        fwd = self.fwd_flops
        return tuple(f / fwd[-1] for f in fwd) if fwd[-1] > 0 else tuple(1.0 for _ in fwd)


def exit_view(model: EarlyExitNet, input_shape: tuple[int, ...], *, batch: int = 4) -> ExitInfo:
    """Measure every exit of ``model``: one forward to exit e and the backward of its logits'
    sum, under ``FlopCounterMode``, per sample. No side effects on the model."""
    params = dict(model.named_parameters())
    ref = next(iter(params.values()))
    x = torch.zeros(batch, *input_shape, dtype=ref.dtype, device=ref.device)
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    fwd, bwd, nbytes, names, bufs = [], [], [], [], []
    try:
        for e in range(1, model.num_exits + 1):
            own = model.exit_params(e)
            with FlopCounterMode(display=False) as fc:
                out = model(x, upto=e)[:, e - 1]
            f = fc.get_total_flops()
            with FlopCounterMode(display=False) as fc:
                torch.autograd.grad(out.sum(), [params[n] for n in own], allow_unused=True)
            fwd.append(f / batch)
            bwd.append(fc.get_total_flops() / batch)
            nbytes.append(sum(params[n].numel() * params[n].element_size() for n in own))
            names.append(own)
            bufs.append(model.exit_buffers(e))
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)
    return ExitInfo(tuple(names), tuple(bufs), tuple(fwd), tuple(bwd), tuple(nbytes))


# ----------------------------------------------------------------------------- backbones
class ResidualBlock(nn.Module):
    """conv3×3 → ReLU → conv3×3, plus the input (a 1×1 conv when the shape changes), ReLU.
    No normalisation (``ee_cnn``: vectorizable, trains on CPU)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.skip = nn.Conv2d(c_in, c_out, 1, stride) if (stride != 1 or c_in != c_out) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(F.relu(self.conv1(x)))
        return F.relu(h + (x if self.skip is None else self.skip(x)))


def ee_cnn(input_shape: tuple[int, ...], num_classes: int, channels: Sequence[int]) -> EarlyExitNet:
    """Stem conv3×3 (c1) → exit 1; residual block (c2, stride 2) → exit 2; residual block
    (c3, stride 2) → exit 3; each head pools to 2×2 (global pooling loses the digit's shape
    and trains far too slowly on MNIST). Exit 1 reads one convolution's features: the weakest
    classifier of the three at the paper's training details (docs/reproductions/cis.md,
    Table 1's exit columns), and after 10 rounds of 10 steps still the only one well above
    chance (the `cis-loop` table there)."""
    if len(channels) != 3:
        raise ValueError("ee_cnn takes three channel counts (model.channels)")
    c1, c2, c3 = channels
    entries = [
        nn.Sequential(nn.Conv2d(input_shape[0], c1, 3, 2, 1), nn.ReLU()),
        ResidualBlock(c1, c2, 2),
        ResidualBlock(c2, c3, 2),
    ]
    return EarlyExitNet(
        "ee_cnn", input_shape, num_classes, entries, (1, 2, 3), (c1, c2, c3), head_pool=2
    )


class HalfBlockL(nn.Module):
    """The first half of a BasicBlock (conv3×3 + BN + ReLU), passing the block's input on."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.relu(self.bn(self.conv(x))), x


class HalfBlockU(nn.Module):
    """The second half: conv3×3 + BN, plus the (downsampled) block input, ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.down = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out else None
        )  # fmt: skip

    def forward(self, xs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h, x = xs
        return F.relu(self.bn(self.conv(h)) + (x if self.down is None else self.down(x)))


def ee_resnet18(input_shape: tuple[int, ...], num_classes: int,
                exits: Sequence[int] | None = None) -> EarlyExitNet:  # fmt: skip
    """The authors' ResNet-18 with early exits: 17 entries (stem, then each BasicBlock as an
    L and a U half), stages of 64/128/256/512 channels with strides 1/1/2/2; exits after
    entries 3, 9, 17 (≤ 10 classes) or 9, 13, 17 (more)."""
    entries: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(input_shape[0], 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64),
                      nn.ReLU())
    ]  # fmt: skip
    widths: list[int] = [64]
    c_in = 64
    for c, stride in ((64, 1), (128, 1), (256, 2), (512, 2)):
        for b in range(2):
            s = stride if b == 0 else 1
            entries += [HalfBlockL(c_in, c, s), HalfBlockU(c_in, c, s)]
            widths += [c, c]
            c_in = c
    chosen = tuple(exits) if exits else ((3, 9, 17) if num_classes <= 10 else (9, 13, 17))
    return EarlyExitNet(
        "ee_resnet18", input_shape, num_classes, entries, chosen, [widths[k - 1] for k in chosen]
    )


__all__ = [
    "EarlyExitNet",
    "ExitInfo",
    "ExitLoss",
    "MultiExitLoss",
    "ResidualBlock",
    "ee_cnn",
    "ee_resnet18",
    "exit_view",
]
