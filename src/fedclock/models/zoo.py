"""Model zoo: the small classifiers used in the FL experiments.

Every model is a :class:`Classifier` whose layers live in one ``nn.Sequential``
called ``net``, so module names are stable (``net.1``, ``net.3`` …) and a layer
view (:func:`fedclock.models.layers.layer_view`) can address them. Models take
a batch shaped ``(B, *input_shape)`` and return logits ``(B, num_classes)``.

Architectures:

``logreg``
    Flatten → Linear(in, num_classes).
``mlp``
    Flatten → [Linear → ReLU] per width in ``hidden`` → Linear(→ num_classes).
    ``hidden=()`` gives the logreg shape.
``cnn``
    The McMahan et al. / SALF shape: Conv(C→channels[0], k) → ReLU → MaxPool(2)
    → Conv(channels[0]→channels[1], k) → ReLU → MaxPool(2) → Flatten
    → Linear(→ fc_hidden) → ReLU → Linear(→ num_classes). ``padding="same"``
    pads by ``k // 2`` (works on 8×8 digits and 28×28 MNIST alike);
    ``padding="valid"`` pads nothing (the SALF authors' CNN is
    ``channels=(6, 6), fc_hidden=50, padding="valid"`` on 28×28: 96 → 50 → 10).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedclock.errors import ConfigError

MODEL_ARCHS: tuple[str, ...] = ("cnn", "logreg", "mlp")
PADDINGS: tuple[str, ...] = ("same", "valid")


class Classifier(nn.Module):
    """A feed-forward classifier: ``forward(x) = net(x)``, returning logits."""

    def __init__(
        self, arch: str, input_shape: tuple[int, ...], num_classes: int, net: nn.Sequential
    ) -> None:
        super().__init__()
        self.arch = arch
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(field: str, value: object) -> int:
    if not _is_int(value) or int(value) < 1:  # type: ignore[call-overload]
        raise ConfigError(f"{field} must be a positive integer, got {value!r}.")
    return int(value)  # type: ignore[call-overload]


def _positive_ints(field: str, values: object) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ConfigError(f"{field} must be a list of positive integers, got {values!r}.")
    if not all(_is_int(v) and v >= 1 for v in values):
        raise ConfigError(f"{field} must be a list of positive integers, got {list(values)!r}.")
    return tuple(int(v) for v in values)


def _flat_size(input_shape: tuple[int, ...]) -> int:
    size = 1
    for d in input_shape:
        size *= d
    return size


def _linear_stack(in_features: int, widths: Sequence[int], num_classes: int) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Flatten(start_dim=1)]
    prev = in_features
    for width in widths:
        layers += [nn.Linear(prev, width), nn.ReLU()]
        prev = width
    layers.append(nn.Linear(prev, num_classes))
    return layers


def _check_cnn_shape(
    input_shape: tuple[int, ...], kernel_size: int, pad: int, padding: str
) -> None:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model.arch 'cnn' needs an image model.input_shape (C, H, W), "
            f"got {input_shape}; use model.arch 'mlp' or 'logreg' for other inputs."
        )
    for side in input_shape[1:]:
        size = side
        for _ in range(2):
            size = (size + 2 * pad - kernel_size + 1) // 2
            if size < 1:
                raise ConfigError(
                    f"model.kernel_size {kernel_size} with model.padding '{padding}' "
                    f"shrinks the input {input_shape} to nothing; "
                    f"use a smaller kernel or padding 'same'."
                )


def _build_net(
    arch: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...],
    channels: tuple[int, ...],
    kernel_size: int,
    fc_hidden: int,
    padding: str,
) -> nn.Sequential:
    if arch == "logreg":
        return nn.Sequential(*_linear_stack(_flat_size(input_shape), (), num_classes))
    if arch == "mlp":
        return nn.Sequential(*_linear_stack(_flat_size(input_shape), hidden, num_classes))
    # cnn
    pad = kernel_size // 2 if padding == "same" else 0
    features = nn.Sequential(
        nn.Conv2d(input_shape[0], channels[0], kernel_size, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels[0], channels[1], kernel_size, padding=pad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(start_dim=1),
    )
    with torch.no_grad():
        flat = int(features(torch.zeros(1, *input_shape)).shape[1])
    return nn.Sequential(
        *features,
        nn.Linear(flat, fc_hidden),
        nn.ReLU(),
        nn.Linear(fc_hidden, num_classes),
    )


def build_model(
    arch: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] = (200, 200),
    channels: Sequence[int] = (32, 64),
    kernel_size: int = 5,
    fc_hidden: int = 512,
    padding: str = "same",
    seed: int | None = None,
) -> nn.Module:
    """Build a classifier of architecture ``arch`` (one of :data:`MODEL_ARCHS`).

    ``input_shape`` is one sample's shape (no batch dimension); the model maps
    ``(B, *input_shape)`` to logits ``(B, num_classes)``. ``hidden`` is used by
    ``mlp``; ``channels``, ``kernel_size``, ``fc_hidden`` and ``padding``
    (``"same"`` = ``k // 2``, ``"valid"`` = 0) by ``cnn``; ``cnn`` needs a
    3-D ``(C, H, W)`` input, the others accept any shape.

    With ``seed`` given, parameters are initialised from ``torch.manual_seed(seed)``
    inside ``torch.random.fork_rng`` (CPU generator), so the same seed gives the
    same parameters and torch's global RNG is left untouched. Without it the
    global RNG is used as usual.

    Raises :class:`~fedclock.errors.ConfigError` for an unknown ``arch`` or a
    field value that does not fit (naming the field).
    """
    if arch not in MODEL_ARCHS:
        raise ConfigError(f"model.arch {arch!r} is unknown; allowed: {', '.join(MODEL_ARCHS)}.")
    shape = _positive_ints("model.input_shape", input_shape)
    if not shape:
        raise ConfigError("model.input_shape must have at least one dimension, got ().")
    n_classes = _positive_int("model.num_classes", num_classes)
    widths = _positive_ints("model.hidden", hidden)
    chans = _positive_ints("model.channels", channels)
    k = _positive_int("model.kernel_size", kernel_size)
    fc = _positive_int("model.fc_hidden", fc_hidden)
    if padding not in PADDINGS:
        raise ConfigError(f"model.padding {padding!r} is unknown; allowed: {', '.join(PADDINGS)}.")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ConfigError(f"model seed must be a non-negative integer, got {seed!r}.")
    if arch == "cnn":
        if len(chans) != 2:
            raise ConfigError(
                f"model.channels must list exactly 2 positive integers for 'cnn', got {list(chans)}."
            )
        _check_cnn_shape(shape, k, k // 2 if padding == "same" else 0, padding)

    def make() -> Classifier:
        net = _build_net(arch, shape, n_classes, widths, chans, k, fc, padding)
        return Classifier(arch, shape, n_classes, net)

    if seed is None:
        return make()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()
