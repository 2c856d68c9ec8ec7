"""The data sets fractune knows (docs/methods.md §8), as what is known without reading them: shape, classes,
sizes, normalisation and augmentation. Pure Python: the config checks names and run lengths against this table,
and the loaders (engine/data/datasets.py, engine/data/text.py) read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    channels: int
    size: int
    classes: int
    train_size: int  # before the validation split
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pad: int  # augmentation: random crop padding (0: none)
    flip: bool
    kind: str = "image"  # "text": a word-level corpus (engine/data/text.py); classes = the vocabulary
    tokens: int = 0  # text: training tokens (nominal, for previews; the loaded split's count wins)

    @property
    def is_text(self) -> bool:
        return self.kind == "text"

    def input_shape(self, seq_len: int) -> tuple[int, ...]:
        """What one sample looks like to ``layer_table``: (C, H, W), or (seq_len,) for text."""
        return (seq_len,) if self.is_text else (self.channels, self.size, self.size)


INFO = {
    "fashion-mnist": DatasetInfo("fashion-mnist", 1, 28, 10, 60000, (0.2860,), (0.3530,), 2, True),
    "digits": DatasetInfo("digits", 1, 8, 10, 1437, (0.3047,), (0.3825,), 0, False),
    "cifar10": DatasetInfo("cifar10", 3, 32, 10, 50000, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010), 4, True),
    "cifar100": DatasetInfo("cifar100", 3, 32, 100, 50000, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010), 4, True),
    "imagenet": DatasetInfo("imagenet", 3, 224, 1000, 1281167, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 0, True),
    # text (methods.md §11): classes = the full training vocabulary, tokens = training tokens with <eos>
    "wikitext103": DatasetInfo("wikitext103", 1, 0, 267735, 0, (), (), 0, False, "text", 103227021),
    "wikitext2": DatasetInfo("wikitext2", 1, 0, 33278, 0, (), (), 0, False, "text", 2088628),
    "fortunes": DatasetInfo("fortunes", 1, 0, 30038, 0, (), (), 0, False, "text", 530734),
}
