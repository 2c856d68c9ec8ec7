"""Damaged or mismatched Fashion-MNIST files are refused before any training, with one line naming the file
and exit 2: a cut archive, a wrong header, a truncated body, a label out of range, swapped files, changed
bytes (the release's checksums), for `fractune train` and for a sweep before Ray starts (docs/reliability.md)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from engine.data.files import FASHION_MNIST_DIR, FMNIST_FILES
from tests.conftest import ROOT, run_main


def _copy(tmp_path):
    folder = tmp_path / "fm"
    folder.mkdir()
    for stem in FMNIST_FILES:
        shutil.copy(FASHION_MNIST_DIR / f"{stem}.gz", folder / f"{stem}.gz")
    return folder


def _rewrite(path, change) -> None:
    data = bytearray(gzip.decompress(path.read_bytes()))
    change(data)
    path.write_bytes(gzip.compress(bytes(data), compresslevel=1))  # gzip's default, 9, is slow on the images


def _cut_archive(folder):
    path = folder / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:2000])


def _label_255(folder):
    _rewrite(folder / "train-labels-idx1-ubyte.gz", lambda d: d.__setitem__(100, 255))


def _bad_header(folder):
    _rewrite(folder / "t10k-images-idx3-ubyte.gz", lambda d: d.__setitem__(2, 0x0D))  # float data


def _truncated_body(folder):
    _rewrite(folder / "t10k-images-idx3-ubyte.gz", lambda d: d.__delitem__(slice(-784, None)))


def _swapped(folder):  # the test labels where the training labels belong, and back
    a, b = folder / "train-labels-idx1-ubyte.gz", folder / "t10k-labels-idx1-ubyte.gz"
    tmp = folder / "x.gz"
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _one_pixel(folder):
    _rewrite(folder / "train-images-idx3-ubyte.gz", lambda d: d.__setitem__(5000, d[5000] ^ 1))


def _labels_relabelled(folder):  # two classes swapped: shape, header and range all look right
    _rewrite(folder / "train-labels-idx1-ubyte.gz",
             lambda d: d.__setitem__(slice(8, None), bytes({0: 1, 1: 0}.get(v, v) for v in d[8:])))


DAMAGE = {
    "cut archive": (_cut_archive, "train-labels-idx1-ubyte.gz is damaged"),
    "label 255": (_label_255, "holds a label of 255; allowed: 0 to 9"),
    "bad header": (_bad_header, "t10k-images-idx3-ubyte.gz is not an IDX file of unsigned bytes"),
    "truncated body": (_truncated_body, "it is truncated or damaged"),
    "swapped": (_swapped, "holds Fashion-MNIST's t10k-labels-idx1-ubyte, not its train-labels-idx1-ubyte"),
    "one pixel": (_one_pixel, "does not match Fashion-MNIST's train-images-idx3-ubyte (SHA-256 differs)"),
    "relabelled": (_labels_relabelled, "does not match Fashion-MNIST's train-labels-idx1-ubyte"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.slow
def test_a_damaged_data_file_is_refused_with_one_line_before_training(damage, tmp_path):
    """`fractune train` in a process of its own, on a copy of the data with one file damaged."""
    folder = _copy(tmp_path)
    harm, expected = DAMAGE[damage]
    harm(folder)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"name": "d", "model": {"name": "tiny"}, "optim": {"iterations": 2},
                                      "data": {"dataset": "fashion-mnist", "train_subset": 64}}))
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", str(config), "--data-dir", str(folder),
                        "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and expected in lines[0] and str(folder) in lines[0], r.stderr
    assert r.stdout == ""  # nothing trained, nothing reported


def test_a_sweep_on_damaged_data_exits_2_before_anything_starts(tmp_path, capsys):
    folder = _copy(tmp_path)
    _label_255(folder)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "damaged", "base": {"model": {"name": "tiny"}, "optim": {"iterations": 2},
                                                                "data": {"dataset": "fashion-mnist",
                                                                         "data_dir": str(folder)}}}))
    code, _, err = run_main("sweep", str(spec), "--storage", str(tmp_path / "runs"), "--tracking-uri",
                            f"sqlite:///{tmp_path / 'm.db'}", "--no-report")
    err = capsys.readouterr().err
    assert code == 2 and "holds a label of 255" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()  # nothing created


def _idx(path, array) -> None:
    import numpy as np

    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def test_images_of_another_size_than_the_data_sets_are_refused(tmp_path):
    """A folder of well-formed IDX files whose training images are 1x1 pixels: the model is built and priced
    for 28x28, so they are refused, naming the files and the size, not trained on."""
    import numpy as np

    from engine.config.sections import DataConfig
    from engine.data.files import fashion_mnist_arrays
    from engine.errors import DataError

    rng = np.random.default_rng(0)
    for stem, shape in zip(FMNIST_FILES, ((300, 1, 1), (300,), (10, 28, 28), (10,))):
        _idx(tmp_path / stem, rng.integers(0, 10 if len(shape) == 1 else 256, shape))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte / train-labels-idx1-ubyte: images of 1x1 "
                                        r"pixels; allowed: 28x28"):
        fashion_mnist_arrays(DataConfig(dataset="fashion-mnist", data_dir=str(tmp_path)))
