"""Data sets: images (Fashion-MNIST, digits, CIFAR, ImageNet) and word-level text corpora (docs/methods.md §8,
§11)."""
