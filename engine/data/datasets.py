"""Data sets (docs/methods.md §8): Fashion-MNIST (the embedded default), digits (tests), CIFAR-10/100, ImageNet;
the language models' corpora (WikiText-103/-2, the embedded ``fortunes``) live in engine/data/text.py.

Small data sets live in memory as uint8 tensors and are batched here, with augmentation done per sample
but vectorised over the batch (random crop with zero padding + horizontal flip, as torchvision's
RandomCrop(pad) + RandomHorizontalFlip), then normalised per channel. ImageNet streams from an ImageFolder
through a DataLoader. A fixed ``split_seed`` holds a validation split out of the training set for model
selection (the reviewers objected to selecting on the test set); test accuracy is reported at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from engine.data.catalog import INFO, DatasetInfo
from engine.data.files import cifar_root, fashion_mnist_arrays, imagenet_dir
from engine.errors import ConfigError, DataError

if TYPE_CHECKING:  # the config's types name the arguments; engine.config.experiment reads this module's table
    from engine.config.sections import DataConfig, SplitConfig

class TensorSplit:
    """An in-memory split: uint8 images (N, C, H, W) and int64 labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, info: DatasetInfo):
        self.images, self.labels, self.info = images, labels, info
        self.mean = torch.tensor(info.mean).view(1, -1, 1, 1) * 255.0
        self.std = torch.tensor(info.std).view(1, -1, 1, 1) * 255.0

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, batch_size: int, shuffle: bool, augment: bool, generator: torch.Generator | None = None,
                device: torch.device | None = None, shards: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of ``batch_size`` in a seeded order; ``shards``: the order cut to a multiple of that many
        samples, so that every batch splits into equal slices (one per data-parallel worker)."""
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        order = order[:n - n % shards]
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            x = self.images[idx]
            if augment:
                x = _augment(x, self.info, generator)
            x = (x.float() - self.mean) / self.std
            y = self.labels[idx]
            if device is not None and device.type != "cpu":
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y


def _augment(x: torch.Tensor, info: DatasetInfo, g: torch.Generator | None) -> torch.Tensor:
    b, c, h, w = x.shape
    p = info.crop_pad
    if p:
        padded = F.pad(x, (p, p, p, p))
        oy = torch.randint(0, 2 * p + 1, (b,), generator=g)
        ox = torch.randint(0, 2 * p + 1, (b,), generator=g)
        rows = (oy[:, None] + torch.arange(h))[:, None, :, None]  # (B, 1, H, 1)
        cols = (ox[:, None] + torch.arange(w))[:, None, None, :]  # (B, 1, 1, W)
        x = padded[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
    if info.flip:
        flip = torch.rand(b, generator=g) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


@dataclass
class DataSplits:
    info: DatasetInfo
    train: object
    val: object | None
    test: object
    unigram_perplexity: float | None = None  # text: the test split under the training unigram


# ---------------------------------------------------------------------------------------------------


def _fashion_mnist(cfg: DataConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    arr = fashion_mnist_arrays(cfg)
    as_x = lambda a: torch.from_numpy(a.copy()).unsqueeze(1)  # noqa: E731  (N, 1, 28, 28) uint8
    as_y = lambda a: torch.from_numpy(a.astype(np.int64))  # noqa: E731
    return as_x(arr["xtr"]), as_y(arr["ytr"]), as_x(arr["xte"]), as_y(arr["yte"])


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images, values 0..16) and labels. Read from the CSV that scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label per row, what ``load_digits`` parses) without
    importing scikit-learn, whose import costs CPU time in every trial process; ``load_digits`` where that
    file is not found."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            rows = np.loadtxt(path, delimiter=",")
            return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def _digits(cfg: DataConfig):
    images, target = _digits_arrays()
    x = torch.from_numpy(np.round(images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))  # fixed 80/20 test split
    n_test = 360
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def _cifar(cfg: DataConfig):
    try:
        from torchvision import datasets
    except Exception as exc:  # pragma: no cover - torchvision is a dependency
        raise DataError(f"data.dataset: {cfg.dataset} needs torchvision ({exc})") from None
    cls = datasets.CIFAR10 if cfg.dataset == "cifar10" else datasets.CIFAR100
    root = str(cifar_root(cfg))
    try:
        tr = cls(root, train=True, download=cfg.download)
        te = cls(root, train=False, download=cfg.download)
    except Exception as exc:
        raise DataError(
            f"data.data_dir: {root} holds no {cfg.dataset} ({str(exc).splitlines()[0]}); pass --data-dir "
            f"to the folder with the python-version archive's contents, or set data.download: true"
        ) from None
    as_x = lambda a: torch.from_numpy(np.ascontiguousarray(a.transpose(0, 3, 1, 2)))  # noqa: E731
    return as_x(tr.data), torch.tensor(tr.targets), as_x(te.data), torch.tensor(te.targets)


def part_indices(labels: torch.Tensor, split: SplitConfig, num_classes: int) -> torch.Tensor:
    """Indices (increasing) of the training samples in ``split.part``: the part's classes, or each class's
    samples shuffled by ``split.seed`` and cut into ``split.parts`` (so every part holds every class)."""
    if split.by == "classes":
        return torch.isin(labels, torch.tensor(split.classes(num_classes))).nonzero().flatten()
    g = torch.Generator().manual_seed(split.seed)
    chosen = []
    for c in range(num_classes):
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        chosen.append(torch.tensor_split(idx, split.parts)[split.part])
    return torch.cat(chosen).sort().values


def apply_split(xtr, ytr, xte, yte, split: SplitConfig | None, num_classes: int):
    """The scenario's training part and its test set: the part's classes (classes) or the whole set (samples)."""
    if split is None:
        return xtr, ytr, xte, yte
    tr = part_indices(ytr, split, num_classes)
    if split.by == "classes":
        te = torch.isin(yte, torch.tensor(split.classes(num_classes))).nonzero().flatten()
        xte, yte = xte[te], yte[te]
    return xtr[tr], ytr[tr], xte, yte


def _split(x: torch.Tensor, y: torch.Tensor, cfg: DataConfig):
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg.split_seed))
    n_val = int(round(len(y) * cfg.val_fraction))
    val, tr = perm[:n_val], perm[n_val:]
    if cfg.train_subset is not None:
        tr = tr[: cfg.train_subset]
    return (x[tr], y[tr]), (x[val], y[val]) if n_val else None


def load_data(cfg: DataConfig) -> DataSplits:
    info = INFO[cfg.dataset]
    if info.is_text:
        return _text(cfg, info)
    if cfg.dataset == "imagenet":
        return _imagenet(cfg, info)
    loader = {"fashion-mnist": _fashion_mnist, "digits": _digits, "cifar10": _cifar, "cifar100": _cifar}[cfg.dataset]
    xtr, ytr, xte, yte = apply_split(*loader(cfg), cfg.split, info.classes)
    (x_train, y_train), val = _split(xtr, ytr, cfg)
    if not len(y_train):  # nothing to train on: refused here, with what emptied it, not by a division later
        if not len(ytr):
            raise ConfigError.single("data.split.part", cfg.split.part, f"allowed: a part that holds training samples (of "
                                     f"{cfg.split.parts} parts of {cfg.dataset}, this one holds none)")
        raise ConfigError.single("data.val_fraction", cfg.val_fraction, f"allowed: a fraction that leaves training samples "
                                 f"(the training set holds {len(ytr)})")
    if cfg.test_subset is not None:
        xte, yte = xte[: cfg.test_subset], yte[: cfg.test_subset]
    return DataSplits(
        info,
        TensorSplit(x_train, y_train, info),
        TensorSplit(*val, info) if val else None,
        TensorSplit(xte, yte, info),
    )


class FolderSplit:
    """An ImageFolder streamed through a DataLoader (ImageNet)."""

    def __init__(self, dataset, cfg: DataConfig, train: bool):
        self.dataset, self.cfg, self.train = dataset, cfg, train

    def __len__(self) -> int:
        return len(self.dataset)

    def batches(self, batch_size: int, shuffle: bool, augment: bool, generator: torch.Generator | None = None,
                device: torch.device | None = None, shards: int = 1):
        # every worker reads the whole global batch and keeps its slice (engine.distributed.World.shard)
        n = len(self.dataset)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=batch_size,
                                             sampler=order[:n - n % shards].tolist(),
                                             num_workers=self.cfg.num_workers,
                                             pin_memory=device is not None and device.type == "cuda")
        for x, y in loader:
            if device is not None and device.type != "cpu":
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y


def _imagenet(cfg: DataConfig, info: DatasetInfo) -> DataSplits:
    from torchvision import datasets, transforms

    imagenet_dir(cfg)
    norm = transforms.Normalize(info.mean, info.std)
    train_tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), norm])
    test_tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), norm])
    full = datasets.ImageFolder(str(Path(cfg.data_dir) / "train"), train_tf)
    perm = torch.randperm(len(full), generator=torch.Generator().manual_seed(cfg.split_seed))
    n_val = int(round(len(full) * cfg.val_fraction))
    tr_idx = perm[n_val:].tolist()
    if cfg.train_subset is not None:
        tr_idx = tr_idx[: cfg.train_subset]
    val_ds = datasets.ImageFolder(str(Path(cfg.data_dir) / "train"), test_tf)
    test = datasets.ImageFolder(str(Path(cfg.data_dir) / "val"), test_tf)
    if cfg.test_subset is not None:
        test = torch.utils.data.Subset(test, range(min(cfg.test_subset, len(test))))
    return DataSplits(
        info,
        FolderSplit(torch.utils.data.Subset(full, tr_idx), cfg, True),
        FolderSplit(torch.utils.data.Subset(val_ds, perm[:n_val].tolist()), cfg, False) if n_val else None,
        FolderSplit(test, cfg, False),
    )


def _text(cfg: DataConfig, info: DatasetInfo) -> DataSplits:
    """A word-level corpus (engine/data/text.py): three token streams; ``classes`` becomes the loaded vocabulary and
    ``unigram_perplexity`` the test split's perplexity under the training unigram (the baseline to beat)."""
    from dataclasses import replace

    from engine.data.text import TokenSplit, load_corpus, unigram_perplexity

    (train, valid, test), vocab = load_corpus(cfg.dataset, cfg.data_dir, cfg.split_seed, cfg.vocab_size)
    tr = TokenSplit(train, cfg.seq_len, cfg.train_subset)
    va = TokenSplit(valid, cfg.seq_len)
    te = TokenSplit(test, cfg.seq_len, cfg.test_subset)
    if min(len(tr), len(te)) == 0:
        # a sequence reads seq_len + 1 tokens (its inputs and their next-token targets)
        raise DataError(f"data.seq_len: got {cfg.seq_len}; allowed: <= {min(len(train), len(test)) - 1} (the "
                        f"{cfg.dataset} train and test splits hold {len(train)} and {len(test)} tokens; a sequence "
                        "takes seq_len + 1)")
    return DataSplits(replace(info, classes=len(vocab), tokens=len(train)), tr, va if len(va) else None, te,
                      unigram_perplexity(train, te.stream[1:te.tokens + 1], len(vocab)))
