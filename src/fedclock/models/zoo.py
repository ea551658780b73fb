"""Model zoo: the classifiers used in the FL experiments.

Every model is a :class:`Classifier` whose layers live in one ``nn.Sequential``
called ``net``, so module names are stable (``net.1``, ``net.3`` …) and a layer
view (:func:`fedclock.models.layers.layer_view`) can address them. Models take
a batch shaped ``(B, *input_shape)`` and return logits ``(B, num_classes)``;
:attr:`Classifier.input_dtype` says whether that batch holds real values
(float32) or token ids (int64, ``lstm``).

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
    ``channels=(6, 6), fc_hidden=50, padding="valid"`` on 28×28: 96 → 50 → 10;
    on 32×32 CIFAR-shaped input it flattens 6·5·5 = 150). ``fc_hidden``
    defaults to 512.
``fraboni_cnn``
    Fraboni et al.'s CIFAR CNN as coded (``CNN_CIFAR_dropout`` with p = 0):
    Conv3×3(C→32) → ReLU → MaxPool(2) → Conv3×3(32→64) → ReLU → MaxPool(2)
    → Conv3×3(64→64) (no ReLU) → Flatten → Linear(→ fc_hidden) → ReLU
    → Linear(→ num_classes), no padding: 32 → 30 → 15 → 13 → 6 → 4, so it
    flattens 64·4·4 = 1024. ``fc_hidden`` defaults to the authors' 64, or 256
    with more than 10 classes (their CIFAR-100 model).
``vgg11`` / ``vgg13`` / ``vgg16`` / ``vgg19``
    VGG with batch norm for CIFAR-shaped input, as in kuangliu/pytorch-cifar
    and the SALF authors' code: each number of the config is Conv3×3(pad 1,
    with bias) → BatchNorm2d → ReLU, each ``M`` a MaxPool(2); then Flatten
    → Linear(512 → num_classes) (their trailing ``AvgPool2d(1)`` is the
    identity and is left out). Needs H, W ≥ 32 (five halvings); on 32×32 the
    flatten is 512. ``vgg_width`` scales every conv's channel count (rounded
    up; 1.0 is the paper's model) to make small CPU runs possible.
``lstm``
    The character LSTM of LEAF / Fraboni et al.: Embedding(num_classes,
    embed_dim = 8) → ``lstm_layers`` (2) stacked LSTM layers of
    ``lstm_hidden`` (100) units, batch first → the last time step
    → Linear(lstm_hidden → num_classes). The vocabulary is the label set
    (next-character prediction), so the embedding has ``num_classes`` rows.
    Each LSTM layer is its own ``nn.LSTM`` module (one layer of the layer
    view), which computes exactly what one ``nn.LSTM(num_layers=2)`` does
    without dropout. Input: token ids ``(B, T)``; ids stored as floats are
    truncated to integers, so a dry run on zeros works.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from fedclock.errors import ConfigError
from fedclock.models.early_exit import ee_cnn, ee_resnet18

VGG_CFGS: dict[str, tuple[int | str, ...]] = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg13": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", *(256,) * 3, "M", *(512,) * 3, "M", *(512,) * 3, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", *(256,) * 4, "M", *(512,) * 4, "M", *(512,) * 4, "M"),
}
EARLY_EXIT_ARCHS: tuple[str, ...] = ("ee_cnn", "ee_resnet18")  # models.early_exit
MODEL_ARCHS: tuple[str, ...] = (
    "cnn", "fraboni_cnn", "logreg", "lstm", "mlp", *VGG_CFGS, *EARLY_EXIT_ARCHS
)  # fmt: skip
TOKEN_ARCHS: tuple[str, ...] = ("lstm",)
"""Architectures whose input is integer token ids rather than real values."""
"""Architectures that need a ``(C, H, W)`` input."""
PADDINGS: tuple[str, ...] = ("same", "valid")


class Classifier(nn.Module):
    """A feed-forward classifier: ``forward(x) = net(x)``, returning logits."""

    def __init__(
        self,
        arch: str,
        input_shape: tuple[int, ...],
        num_classes: int,
        net: nn.Sequential,
        input_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.arch = arch
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.input_dtype = input_dtype
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` that accepts token ids stored in any dtype (cast to int64)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input.long())


class LSTMLayer(nn.LSTM):
    """One batch-first LSTM layer that returns only its output sequence ``(B, T, hidden)``."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size, num_layers=1, batch_first=True)

    def forward(  # type: ignore[override]
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        out, _state = super().forward(input, hx)
        return out


class LastStep(nn.Module):
    """``x[:, -1]``: the last time step of a batch-first sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -1]


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


def _conv_out(side: int, kernel: int, pad: int) -> int:
    return side + 2 * pad - kernel + 1


def _check_image_shape(arch: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model.arch '{arch}' needs an image model.input_shape (C, H, W), "
            f"got {input_shape}; use model.arch 'mlp' or 'logreg' for other inputs."
        )


def _check_cnn_shape(
    input_shape: tuple[int, ...], kernel_size: int, pad: int, padding: str
) -> None:
    _check_image_shape("cnn", input_shape)
    for side in input_shape[1:]:
        size = side
        for _ in range(2):
            size = _conv_out(size, kernel_size, pad) // 2
            if size < 1:
                raise ConfigError(
                    f"model.kernel_size {kernel_size} with model.padding '{padding}' "
                    f"shrinks the input {input_shape} to nothing; "
                    f"use a smaller kernel or padding 'same'."
                )


def _check_fraboni_shape(input_shape: tuple[int, ...]) -> None:
    _check_image_shape("fraboni_cnn", input_shape)
    for side in input_shape[1:]:
        size = _conv_out(_conv_out(side, 3, 0) // 2, 3, 0) // 2
        if _conv_out(size, 3, 0) < 1:
            raise ConfigError(
                f"model.arch 'fraboni_cnn' needs images of at least 18×18 (three unpadded 3×3 "
                f"convs and two 2×2 pools), got model.input_shape {input_shape}."
            )


def _check_vgg_shape(arch: str, input_shape: tuple[int, ...]) -> None:
    _check_image_shape(arch, input_shape)
    pools = sum(1 for v in VGG_CFGS[arch] if v == "M")
    if min(input_shape[1:]) < 2**pools:
        raise ConfigError(
            f"model.arch '{arch}' needs images of at least {2**pools}×{2**pools} (its {pools} "
            f"max-pools halve each side), got model.input_shape {input_shape}."
        )


def _flat_features(features: nn.Sequential, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).shape[1])


def _cnn(
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, ...],
    kernel_size: int,
    fc_hidden: int,
    padding: str,
) -> nn.Sequential:
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
    flat = _flat_features(features, input_shape)
    return nn.Sequential(
        *features,
        nn.Linear(flat, fc_hidden),
        nn.ReLU(),
        nn.Linear(fc_hidden, num_classes),
    )


def _fraboni_cnn(input_shape: tuple[int, ...], num_classes: int, fc_hidden: int) -> nn.Sequential:
    features = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3),
        nn.Flatten(start_dim=1),
    )
    flat = _flat_features(features, input_shape)
    return nn.Sequential(
        *features,
        nn.Linear(flat, fc_hidden),
        nn.ReLU(),
        nn.Linear(fc_hidden, num_classes),
    )


def _vgg(arch: str, input_shape: tuple[int, ...], num_classes: int, width: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    prev = input_shape[0]
    for v in VGG_CFGS[arch]:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            out = math.ceil(int(v) * width)
            layers += [nn.Conv2d(prev, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            prev = out
    features = nn.Sequential(*layers, nn.Flatten(start_dim=1))
    flat = _flat_features(features, input_shape)
    return nn.Sequential(*features, nn.Linear(flat, num_classes))


def _lstm(num_classes: int, embed_dim: int, hidden: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = [TokenEmbedding(num_classes, embed_dim)]
    prev = embed_dim
    for _ in range(layers):
        mods.append(LSTMLayer(prev, hidden))
        prev = hidden
    return nn.Sequential(*mods, LastStep(), nn.Linear(hidden, num_classes))


def default_fc_hidden(arch: str, num_classes: int) -> int:
    """``fc_hidden`` when none is given: 512 for ``cnn``; 64 (≤ 10 classes) or 256 for ``fraboni_cnn``."""
    if arch == "fraboni_cnn":
        return 64 if num_classes <= 10 else 256
    return 512


# (over 80 lines: each argument checked with its own one-sentence error, then one short
# branch per architecture; a split would pass its 15 arguments around)
def build_model(
    arch: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] = (200, 200),
    channels: Sequence[int] = (32, 64),
    kernel_size: int = 5,
    fc_hidden: int | None = None,
    padding: str = "same",
    embed_dim: int = 8,
    lstm_hidden: int = 100,
    lstm_layers: int = 2,
    vgg_width: float = 1.0,
    exits: Sequence[int] | None = None,
    input_dtype: torch.dtype | None = None,
    seed: int | None = None,
) -> nn.Module:
    """Build a classifier of architecture ``arch`` (one of :data:`MODEL_ARCHS`).

    ``input_shape`` is one sample's shape (no batch dimension); the model maps
    ``(B, *input_shape)`` to logits ``(B, num_classes)``. ``hidden`` is used by
    ``mlp``; ``channels``, ``kernel_size`` and ``padding`` (``"same"`` =
    ``k // 2``, ``"valid"`` = 0) by ``cnn``; ``fc_hidden`` by ``cnn`` and
    ``fraboni_cnn`` (``None``: :func:`default_fc_hidden`); ``embed_dim``,
    ``lstm_hidden`` and ``lstm_layers`` by ``lstm``; ``vgg_width`` by the VGGs.
    ``cnn``, ``fraboni_cnn`` and the VGGs need a 3-D ``(C, H, W)`` input,
    ``lstm`` a 1-D ``(T,)`` one of token ids; ``logreg`` and ``mlp`` accept
    any shape. ``input_dtype``, the dataset's input type when given, is
    checked against the architecture: token ids (an integer type) go with
    ``lstm`` only, real values with every other architecture.

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
    fc = (
        default_fc_hidden(arch, n_classes)
        if fc_hidden is None
        else _positive_int("model.fc_hidden", fc_hidden)
    )
    emb = _positive_int("model.embed_dim", embed_dim)
    lstm_h = _positive_int("model.lstm_hidden", lstm_hidden)
    lstm_n = _positive_int("model.lstm_layers", lstm_layers)
    if (
        isinstance(vgg_width, bool)
        or not isinstance(vgg_width, int | float)
        or not (0 < vgg_width < math.inf)
    ):
        raise ConfigError(f"model.vgg_width must be a finite number > 0, got {vgg_width!r}.")
    if padding not in PADDINGS:
        raise ConfigError(f"model.padding {padding!r} is unknown; allowed: {', '.join(PADDINGS)}.")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ConfigError(f"model seed must be a non-negative integer, got {seed!r}.")
    tokens = arch in TOKEN_ARCHS
    if input_dtype is not None and input_dtype.is_floating_point == tokens:
        if tokens:
            raise ConfigError(
                f"model.arch '{arch}' needs token ids as input (data.name 'shakespeare'), "
                f"but the dataset gives real values of type {input_dtype}."
            )
        raise ConfigError(
            f"model.arch '{arch}' needs real-valued input, but the dataset gives token ids; "
            f"use model.arch 'lstm' for text."
        )
    if arch == "cnn":
        if len(chans) != 2:
            raise ConfigError(
                f"model.channels must list exactly 2 positive integers for 'cnn', got {list(chans)}."
            )
        _check_cnn_shape(shape, k, k // 2 if padding == "same" else 0, padding)
    elif arch == "fraboni_cnn":
        _check_fraboni_shape(shape)
    elif arch in VGG_CFGS:
        _check_vgg_shape(arch, shape)
    elif arch in EARLY_EXIT_ARCHS:
        if len(shape) != 3:
            raise ConfigError(
                f"model.arch '{arch}' needs image input (C, H, W), model.input_shape {shape}."
            )
        if arch == "ee_cnn" and len(chans) != 3:
            raise ConfigError(
                f"model.channels must list exactly 3 positive integers for 'ee_cnn', got {list(chans)}."
            )
    elif tokens and len(shape) != 1:
        raise ConfigError(
            f"model.arch '{arch}' needs token sequences, model.input_shape (T,), got {shape}; "
            f"use data.name 'shakespeare'."
        )

    def make() -> nn.Module:
        net: nn.Sequential
        if arch == "ee_cnn":
            return ee_cnn(shape, n_classes, chans)
        if arch == "ee_resnet18":
            return ee_resnet18(shape, n_classes, exits)
        if arch == "logreg":
            net = nn.Sequential(*_linear_stack(_flat_size(shape), (), n_classes))
        elif arch == "mlp":
            net = nn.Sequential(*_linear_stack(_flat_size(shape), widths, n_classes))
        elif arch == "cnn":
            net = _cnn(shape, n_classes, chans, k, fc, padding)
        elif arch == "fraboni_cnn":
            net = _fraboni_cnn(shape, n_classes, fc)
        elif arch in VGG_CFGS:
            net = _vgg(arch, shape, n_classes, float(vgg_width))
        else:
            net = _lstm(n_classes, emb, lstm_h, lstm_n)
        dtype = torch.int64 if tokens else torch.float32
        return Classifier(arch, shape, n_classes, net, input_dtype=dtype)

    if seed is None:
        return make()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()
