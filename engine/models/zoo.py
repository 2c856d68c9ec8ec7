"""The model zoo: every model module, imported so that its builders register, and ``build_model``, which looks a
name up in ``MODELS``."""

from __future__ import annotations

from engine.errors import ConfigError
from engine.models import mobilenetv2, resnet_cifar, resnet_imagenet, transformer  # noqa: F401  (registration)
from engine.models.base import MODELS, LayerInfo, QModel
from engine.models.catalog import unknown_model


def build_model(name: str, in_channels: int, num_classes: int, act_momentum: float = 0.9) -> QModel:
    if allowed := unknown_model(name):
        raise ConfigError.single("model.name", name, allowed)
    return MODELS[name](in_channels=in_channels, num_classes=num_classes, act_momentum=act_momentum)


__all__ = ["MODELS", "LayerInfo", "QModel", "build_model"]
