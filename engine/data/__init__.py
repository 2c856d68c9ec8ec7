"""Data sets: images (Fashion-MNIST, digits, CIFAR, ImageNet) and word-level text corpora (docs/methods.md §8,
§11)."""

from engine._moved import package_getattr

__getattr__ = package_getattr(__name__)  # the old module engine.data's names, with a DeprecationWarning
