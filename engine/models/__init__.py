"""Model zoo: CIFAR ResNets (8..110, 164), MobileNetV2, ImageNet ResNet-18/34, a tiny test net, causal
Transformer language models (``transformer_base``, ``transformer_small``, ``transformer_tiny``).

``build_model(name, in_channels, num_classes, act_momentum)`` looks a name up in ``MODELS``. The names, their
tasks and the ``LayerMap`` come from ``engine.models.catalog`` without torch; the zoo itself (``build_model``,
``MODELS``, ``QModel``, ``LayerInfo``) loads on first use.
"""

from __future__ import annotations

from engine.models.catalog import LayerMap, is_language_model, task_of, unknown_model

_ZOO = ("MODELS", "LayerInfo", "QModel", "build_model")  # importing the zoo registers every model in MODELS


def __getattr__(name: str):
    if name in _ZOO:
        from engine.models import zoo

        return getattr(zoo, name)
    raise AttributeError(f"module 'engine.models' has no attribute {name!r}")


__all__ = ["MODELS", "LayerInfo", "LayerMap", "QModel", "build_model", "is_language_model", "task_of",
           "unknown_model"]
