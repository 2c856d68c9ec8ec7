"""A data set's files on disk, read and checked without torch: the checks a sweep's driver runs before any trial
starts (``check_available``: files missing or damaged are refused in one line) and the numpy readers of
Fashion-MNIST's IDX files that engine.data.datasets turns into tensors."""

from __future__ import annotations

import gzip
import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.data.catalog import INFO
from engine.errors import DataError

if TYPE_CHECKING:
    from engine.config.sections import DataConfig

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


# the files as Fashion-MNIST's release holds them (decompressed: a recompressed .gz reads the same): magic's
# dimensions, the shape, and the SHA-256 of the decompressed bytes
FMNIST_KNOWN = {
    "train-images-idx3-ubyte": ((60000, 28, 28), "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
    "train-labels-idx1-ubyte": ((60000,), "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
    "t10k-images-idx3-ubyte": ((10000, 28, 28), "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
    "t10k-labels-idx1-ubyte": ((10000,), "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
}


def _read_idx(path: Path) -> np.ndarray:
    """``_read_idx_checked``, read once per process for a file unchanged since (a check before training and the
    load itself read it once)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _IDX_CACHE:
        if len(_IDX_CACHE) >= 8:  # a few file sets at most: a process reads the same four
            _IDX_CACHE.clear()
        _IDX_CACHE[key] = _read_idx_checked(path)
    return _IDX_CACHE[key]


_IDX_CACHE: dict[tuple, np.ndarray] = {}


def _read_idx_checked(path: Path) -> np.ndarray:
    """An IDX file (uint8), checked whole: a damaged or truncated file, a header that does not describe the
    data, a label out of range, a swapped file or one of the release's size whose bytes are not the release's
    is refused with one line naming it."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:  # a cut or corrupted .gz
        raise DataError(f"data: {path} is damaged ({type(exc).__name__}: {exc}); reinstall or re-download it") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or not 1 <= data[3] <= 4:
        raise DataError(f"data: {path} is not an IDX file of unsigned bytes (its header is {data[:4].hex() or 'empty'}; "
                        "expected 000008 and the number of dimensions)")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = 4 + 4 * ndim + math.prod(dims)
    if len(data) != expected:
        raise DataError(f"data: {path} holds {len(data)} bytes where its header {dims} needs {expected}: it is "
                        "truncated or damaged")
    stem = path.name.removesuffix(".gz")
    if stem in FMNIST_KNOWN:
        _check_known(path, stem, data, tuple(dims), 4 + 4 * ndim)
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _check_known(path: Path, stem: str, data: bytes, dims: tuple, offset: int) -> None:
    """A file named as one of Fashion-MNIST's: its labels are classes; where its shape is one of the release's,
    its bytes must be that file's (a swapped file holds another one's, a damaged one none). A copy of another size
    (a user's subset) is checked by its structure alone."""

    classes = INFO["fashion-mnist"].classes
    if len(dims) == 1 and len(data) > offset and max(data[offset:]) >= classes:
        raise DataError(f"data: {path} holds a label of {max(data[offset:])}; allowed: 0 to {classes - 1}")
    if all(shape != dims for shape, _ in FMNIST_KNOWN.values()):
        return
    digest = hashlib.sha256(data).hexdigest()
    owner = next((name for name, (_, known) in FMNIST_KNOWN.items() if known == digest), None)
    if owner is not None and owner != stem:
        raise DataError(f"data: {path} holds Fashion-MNIST's {owner}, not its {stem} (swapped files)")
    if dims == FMNIST_KNOWN[stem][0] and owner is None:
        raise DataError(f"data: {path} does not match Fashion-MNIST's {stem} (SHA-256 differs): damaged or "
                        "replaced; reinstall dataset-fashion-mnist or re-download it")


def _check_pair(images: np.ndarray, labels: np.ndarray, classes: int, size: int, where: str) -> None:
    """Images and labels of one split that belong together: as many labels as images, each a class index, every
    image of the data set's size (the model is built, and its cost priced, for that size)."""
    if images.ndim != 3 or labels.ndim != 1:
        raise DataError(f"data: {where}: images of {images.ndim} dimensions and labels of {labels.ndim}; expected 3 "
                        "and 1 (a swapped file?)")
    if images.shape[1:] != (size, size):
        raise DataError(f"data: {where}: images of {images.shape[1]}x{images.shape[2]} pixels; allowed: "
                        f"{size}x{size} (the data set's)")
    if len(images) != len(labels):
        raise DataError(f"data: {where}: {len(images)} images but {len(labels)} labels")
    if len(labels) and int(labels.max()) >= classes:
        raise DataError(f"data: {where}: a label of {int(labels.max())}; allowed: 0 to {classes - 1}")


def _find_idx(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise DataError(
        f"data.data_dir: {folder} has no {stem}[.gz]; install Fashion-MNIST with "
        "`apt-get install dataset-fashion-mnist` (files under /usr/share/datasets/fashion-mnist) "
        "or pass --data-dir DIR holding the four *-ubyte[.gz] files"
    )


FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def check_available(cfg: DataConfig, here: bool = True) -> None:
    """Fail fast, with a one-line DataError, when a data set's files are not where the config says. ``here``:
    the data is read on this machine (``False`` for a sweep on a cluster, whose trials may run where this
    machine's cache is not: CIFAR's files are then looked for by the trials only)."""
    if INFO[cfg.dataset].is_text:
        from engine.data.text import check_text

        check_text(cfg.dataset, cfg.data_dir)
    elif cfg.dataset == "fashion-mnist":  # read and checked whole (``_read_idx``): a damaged file is refused here
        fashion_mnist_arrays(cfg)
    elif cfg.dataset == "imagenet":
        imagenet_dir(cfg)
    elif cfg.dataset in CIFAR_FILES and not cfg.download and here:
        cifar_files(cfg)
    elif cfg.data_dir and not cfg.download and not Path(cfg.data_dir).is_dir():
        raise DataError(f"data.data_dir: {cfg.data_dir} is not a folder; pass --data-dir to the folder holding "
                        f"{cfg.dataset}, or set data.download: true")


def fashion_mnist_arrays(cfg: DataConfig) -> dict[str, np.ndarray]:
    """Fashion-MNIST's four files, read and checked whole (a damaged file is refused in one line): train and
    test images (N, 28, 28) uint8 and labels (N,), as ``xtr``, ``ytr``, ``xte``, ``yte``."""
    folder = Path(cfg.data_dir) if cfg.data_dir else FASHION_MNIST_DIR
    files = {k: _find_idx(folder, stem) for k, stem in zip(("xtr", "ytr", "xte", "yte"), FMNIST_FILES)}
    arr = {k: _read_idx(p) for k, p in files.items()}
    info = INFO["fashion-mnist"]
    for x, y in (("xtr", "ytr"), ("xte", "yte")):
        _check_pair(arr[x], arr[y], info.classes, info.size, f"{files[x].name} / {files[y].name}")
    return arr


# the python-version archives' folders and files, as torchvision's CIFAR10 and CIFAR100 read them
CIFAR_FILES = {"cifar10": ("cifar-10-batches-py", (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")),
               "cifar100": ("cifar-100-python", ("train", "test"))}


def cifar_root(cfg: DataConfig) -> Path:
    return Path(cfg.data_dir) if cfg.data_dir else Path.home() / ".cache" / "fractune" / cfg.dataset


def cifar_files(cfg: DataConfig) -> None:
    """Every file of the archive where the loader will look: a missing one is refused here, before any work, as
    the loader would refuse it (it checks their contents when it reads them)."""
    root = cifar_root(cfg)
    folder, names = CIFAR_FILES[cfg.dataset]
    missing = [name for name in names if not (root / folder / name).is_file()]
    if missing:
        raise DataError(f"data.data_dir: {root} holds no {cfg.dataset} ({folder}/{missing[0]} is missing); pass "
                        "--data-dir to the folder with the python-version archive's contents, or set "
                        "data.download: true")


def imagenet_dir(cfg: DataConfig) -> None:
    if not cfg.data_dir or not (Path(cfg.data_dir) / "train").is_dir() or not (Path(cfg.data_dir) / "val").is_dir():
        raise DataError(f"data.data_dir: {cfg.data_dir!r} must hold ImageNet as train/ and val/ class folders "
                        "(pass --data-dir)")
