"""Data sets: the embedded Fashion-MNIST, digits, splits, augmentation and clear errors for missing files."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from engine.config.sections import DataConfig
from engine.data.catalog import INFO
from engine.data.datasets import _augment, load_data
from engine.data.files import FASHION_MNIST_DIR
from engine.errors import DataError


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="needs Debian's dataset-fashion-mnist (make install)")
def test_fashion_mnist_from_the_debian_package():
    d = load_data(DataConfig(val_fraction=0.1))
    assert (len(d.train), len(d.val), len(d.test)) == (54000, 6000, 10000)
    x, y = next(d.train.batches(16, shuffle=True, augment=True, generator=torch.Generator().manual_seed(0)))
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and y.max() <= 9
    assert DataConfig().split_sizes() == (54000, 6000)
    assert DataConfig(batch_size=128).iterations_per_epoch() == 422


def test_fashion_mnist_from_a_data_dir(tmp_path):
    # a user's copy in idx format (uncompressed here), 20 training and 10 test images
    def write(name, arr, magic):
        header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
        (tmp_path / name).write_bytes(header + arr.astype(np.uint8).tobytes())
        assert magic

    rng = np.random.default_rng(0)
    write("train-images-idx3-ubyte", rng.integers(0, 255, (20, 28, 28)), 1)
    write("train-labels-idx1-ubyte", rng.integers(0, 10, 20), 1)
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as f:
        arr = rng.integers(0, 255, (10, 28, 28)).astype(np.uint8)
        f.write(bytes([0, 0, 8, 3]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.tobytes())
    write("t10k-labels-idx1-ubyte", rng.integers(0, 10, 10), 1)
    d = load_data(DataConfig(data_dir=str(tmp_path), val_fraction=0.25))
    assert (len(d.train), len(d.val), len(d.test)) == (15, 5, 10)


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(DataError) as info:
        load_data(DataConfig(data_dir=str(tmp_path)))
    msg = str(info.value)
    assert "data.data_dir" in msg and "apt-get install dataset-fashion-mnist" in msg and "\n" not in msg
    with pytest.raises(DataError, match="data.data_dir: .* holds no cifar10"):
        load_data(DataConfig(dataset="cifar10", data_dir=str(tmp_path)))


@pytest.mark.parametrize("dataset, folder, first", [("cifar10", "cifar-10-batches-py", "data_batch_1"),
                                                     ("cifar100", "cifar-100-python", "train")])
def test_cifar_files_missing_where_the_loader_looks_are_refused_before_any_work(tmp_path, monkeypatch, dataset,
                                                                                  folder, first):
    """In the folder named, or in the default cache where none is: the first missing file named, in one line;
    a sweep on a cluster leaves the check to its trials (this machine's cache is not theirs); with every file
    there, the check passes and the loader checks their contents."""
    from engine.data.files import CIFAR_FILES, check_available

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for cfg, root in ((DataConfig(dataset=dataset), tmp_path / "home" / ".cache" / "fractune" / dataset),
                      (DataConfig(dataset=dataset, data_dir=str(tmp_path)), tmp_path)):
        with pytest.raises(DataError) as info:
            check_available(cfg)
        msg = str(info.value)
        assert msg.startswith(f"data.data_dir: {root} holds no {dataset} ({folder}/{first} is missing)"), msg
        assert "\n" not in msg and "data.download: true" in msg
    check_available(DataConfig(dataset=dataset), here=False)
    check_available(DataConfig(dataset=dataset, download=True))
    (tmp_path / folder).mkdir()
    for name in CIFAR_FILES[dataset][1][:-1]:
        (tmp_path / folder / name).write_bytes(b"")
    with pytest.raises(DataError, match=f"{folder}/{CIFAR_FILES[dataset][1][-1]} is missing"):
        check_available(DataConfig(dataset=dataset, data_dir=str(tmp_path)))
    (tmp_path / folder / CIFAR_FILES[dataset][1][-1]).write_bytes(b"")
    check_available(DataConfig(dataset=dataset, data_dir=str(tmp_path)))


def test_digits_split_is_fixed_and_disjoint():
    a = load_data(DataConfig(dataset="digits", val_fraction=0.1, split_seed=0))
    b = load_data(DataConfig(dataset="digits", val_fraction=0.1, split_seed=0))
    assert torch.equal(a.val.images, b.val.images)
    assert len(a.train) + len(a.val) == INFO["digits"].train_size and len(a.test) == 360
    sub = load_data(DataConfig(dataset="digits", train_subset=100, test_subset=50))
    assert len(sub.train) == 100 and len(sub.test) == 50


@pytest.mark.slow
def test_digits_read_from_the_shipped_csv_equal_load_digits(monkeypatch):
    """The digits come from scikit-learn's CSV without importing scikit-learn; they are exactly what
    ``load_digits`` returns, and where the file is not found ``load_digits`` itself is used."""
    import importlib.util
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from engine.data import datasets as data

    images, target = data._digits_arrays()
    ref = load_digits()
    assert np.array_equal(images, ref.images) and np.array_equal(target, ref.target) and images.shape == (1797, 8, 8)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no file to read: the fallback
    images, target = data._digits_arrays()
    assert np.array_equal(images, ref.images) and np.array_equal(target, ref.target)
    code = ("import sys; from engine.config.sections import DataConfig; from engine.data.datasets import load_data; "
            "load_data(DataConfig(dataset='digits')); print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_augmentation_crops_and_flips_per_sample():
    info = INFO["cifar10"]
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32).to(torch.uint8)
    out = _augment(x.repeat(32, 1, 1, 1), info, torch.Generator().manual_seed(0))
    assert out.shape == (64, 3, 32, 32)
    assert len({tuple(o.flatten()[:40].tolist()) for o in out[::2]}) > 5  # different crops per sample


def test_a_split_that_leaves_no_training_sample_is_refused_naming_the_field():
    """Every class's samples are cut into the parts: on digits (about 143 per class) a part past that holds
    none. The config check refuses such parts; the loader, which sees the real data (a copy smaller than the
    catalog says), refuses an empty training set, never a division by zero later."""
    from engine.config.experiment import parse_config
    from engine.config.sections import DataConfig
    from engine.data.datasets import load_data
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^data\.split\.parts: got 1000; allowed: <= 143 "):
        parse_config({"data": {"dataset": "digits", "split": {"by": "samples", "parts": 1000, "part": 999}}})
    cfg = DataConfig(dataset="digits", split={"by": "samples", "parts": 143, "part": 0})
    unchecked = cfg.model_copy(update={"split": cfg.split.model_copy(update={"parts": 1000, "part": 999})})
    with pytest.raises(ConfigError, match=r"^data\.split\.part: got 999; allowed: a part that holds training"):
        load_data(unchecked)
    everything_held_out = cfg.model_copy(update={"val_fraction": 0.999})
    with pytest.raises(ConfigError, match=r"^data\.val_fraction: got 0\.999; allowed: a fraction that leaves"):
        load_data(everything_held_out)
