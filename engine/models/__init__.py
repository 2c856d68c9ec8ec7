"""Model zoo: CIFAR ResNets (8..110, 164), MobileNetV2, ImageNet ResNet-18/34, a tiny test net, causal
Transformer language models (``transformer_base``, ``transformer_small``, ``transformer_tiny``).

``build_model(name, in_channels, num_classes, act_momentum)`` looks a name up in ``MODELS``.
"""

from __future__ import annotations

from engine.errors import ConfigError
from engine.metrics import Task
from engine.models import mobilenetv2, resnet_cifar, resnet_imagenet, transformer  # noqa: F401  (registration)
from engine.models.base import MODELS, LayerInfo, LayerMap, QModel


def task_of(name: str) -> Task:
    """What the model ``name`` learns: a causal Transformer LM (text data, token inputs, per-token costs) or an
    image classifier."""
    return Task.LANGUAGE_MODEL if name in transformer.PRESETS else Task.CLASSIFIER


def is_language_model(name: str) -> bool:
    return task_of(name) is Task.LANGUAGE_MODEL


def unknown_model(name: str) -> str | None:
    """What is allowed, where ``name`` is no model of the zoo: the one rule for a config's ``model.name`` and
    for ``build_model`` called directly."""
    return None if name in MODELS else f"allowed: {', '.join(sorted(MODELS))}"


def build_model(name: str, in_channels: int, num_classes: int, act_momentum: float = 0.9) -> QModel:
    if allowed := unknown_model(name):
        raise ConfigError.single("model.name", name, allowed)
    return MODELS[name](in_channels=in_channels, num_classes=num_classes, act_momentum=act_momentum)


__all__ = ["MODELS", "LayerInfo", "LayerMap", "QModel", "build_model", "is_language_model", "task_of",
           "unknown_model"]
