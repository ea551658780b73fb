"""Models: the classifier zoo and a per-layer view (parameters, FLOPs) of any model."""

from fedclock.models.layers import LayerInfo, layer_view, param_bytes, rnn_flops, total_flops
from fedclock.models.zoo import MODEL_ARCHS, TOKEN_ARCHS, VGG_CFGS, build_model

__all__ = [
    "MODEL_ARCHS",
    "TOKEN_ARCHS",
    "VGG_CFGS",
    "LayerInfo",
    "build_model",
    "layer_view",
    "param_bytes",
    "rnn_flops",
    "total_flops",
]
