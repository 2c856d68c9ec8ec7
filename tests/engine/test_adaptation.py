"""Adaptation and fine-tuning (FracTrain supplement §5): training-set parts (``data.split``) and starting from a
pretrained checkpoint (``init``), on sklearn digits with the tiny model."""

from __future__ import annotations

import pytest
import torch

from engine import checkpoint
from engine.config.experiment import parse_config
from engine.config.sections import DataConfig, SplitConfig
from engine.data.datasets import load_data, part_indices
from engine.errors import CheckpointError, ConfigError
from engine.train import train_and_evaluate
from tests.conftest import run_main

BASE = {"model": {"name": "tiny"}, "data": {"dataset": "digits", "batch_size": 64}, "optim": {"epochs": 1}}


def _labels(split: dict | None, part: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = load_data(DataConfig(dataset="digits", val_fraction=0.0, split={**split, "part": part} if split else None))
    return d.train.labels, d.test.labels


def _train_images(split: dict, part: int) -> set[bytes]:
    d = load_data(DataConfig(dataset="digits", val_fraction=0.0, split={**split, "part": part}))
    return {bytes(x.flatten().tolist()) for x in d.train.images}


def test_class_halves_are_disjoint_cover_every_class_and_the_test_set_follows():
    split = {"by": "classes"}
    (tr0, te0), (tr1, te1) = _labels(split, 0), _labels(split, 1)
    assert set(tr0.tolist()) == set(te0.tolist()) == {0, 1, 2, 3, 4}  # natural order: classes 0-4, then 5-9
    assert set(tr1.tolist()) == set(te1.tolist()) == {5, 6, 7, 8, 9}
    full_tr, full_te = _labels(None, 0)
    assert len(tr0) + len(tr1) == len(full_tr) and len(te0) + len(te1) == len(full_te)
    shuffled = [SplitConfig(by="classes", part=p, shuffle_classes=True, seed=3).classes(10) for p in (0, 1)]
    assert sorted(shuffled[0] + shuffled[1]) == list(range(10)) and shuffled[0] != [0, 1, 2, 3, 4]
    assert shuffled[0] == SplitConfig(by="classes", shuffle_classes=True, seed=3).classes(10)


def test_sample_halves_are_disjoint_cover_the_training_set_and_hold_every_class():
    labels = load_data(DataConfig(dataset="digits", val_fraction=0.0)).train.labels
    halves = [part_indices(labels, SplitConfig(by="samples", part=p, seed=7), 10) for p in (0, 1)]
    a, b = set(halves[0].tolist()), set(halves[1].tolist())
    assert not a & b and a | b == set(range(len(labels)))
    for h in halves:
        assert set(labels[h].tolist()) == set(range(10))
        assert abs(len(h) - len(labels) / 2) <= 10  # per-class halves: sizes within a sample per class
    # the same seed gives the same split, another seed another one
    assert torch.equal(part_indices(labels, SplitConfig(by="samples", seed=7), 10), halves[0])
    assert not torch.equal(part_indices(labels, SplitConfig(by="samples", seed=8), 10), halves[0])
    # loaded: the images of the two halves are disjoint too, and the whole test set is kept
    split = {"by": "samples", "seed": 7}
    assert not _train_images(split, 0) & _train_images(split, 1)
    assert len(_labels(split, 0)[1]) == len(_labels(None, 0)[1])


def test_split_sizes_follow_the_part():
    n_full = DataConfig(dataset="cifar100", val_fraction=0.1).split_sizes()[0]
    n_half = DataConfig(dataset="cifar100", val_fraction=0.1, split={"by": "classes"}).split_sizes()[0]
    assert n_full == 45000 and n_half == 22500


@pytest.mark.parametrize("tree, field", [
    ({"data": {"split": {"by": "classes", "part": 2}}}, "data.split"),
    ({"data": {"split": {"by": "rows"}}}, "data.split.by"),
    ({"data": {"dataset": "digits", "split": {"by": "classes", "parts": 11}}}, "data.split.parts"),
    ({"data": {"dataset": "imagenet", "split": {"by": "samples"}}}, "data.split"),
    ({"init": {"checkpoint": "x", "head": "drop"}}, "init.head"),
])
def test_bad_split_or_init_names_the_field(tree, field):
    with pytest.raises(ConfigError) as err:
        parse_config(tree)
    assert any(f.startswith(field) for f, _, _ in err.value.problems), err.value.problems


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """An FP32 run on the first sample half (3 epochs), its last checkpoint and result."""
    folder = tmp_path_factory.mktemp("pretrain")
    cfg = parse_config({**BASE, "optim": {"epochs": 3}, "data": {**BASE["data"], "split": {"by": "samples"}}})
    result = train_and_evaluate(cfg, report=lambda m, save: save(folder))
    return folder, result


@pytest.mark.slow
def test_init_keeps_the_pretrained_model_and_starts_above_chance(pretrained):
    folder, pre = pretrained
    cfg = parse_config({**BASE, "data": {**BASE["data"], "split": {"by": "samples", "part": 1}},
                        "init": {"checkpoint": str(folder)}})
    assert cfg.init.head == "keep"  # the default: the supplement retrains the same model
    result = train_and_evaluate(cfg)
    # the whole test set in both halves: before any step, the retrain scores what the pretrain ended with
    assert result.history[0]["init_accuracy"] == pytest.approx(pre.metrics["accuracy"]) and pre.metrics["accuracy"] > 0.25
    assert result.metrics["init_accuracy"] == result.history[0]["init_accuracy"]
    assert 0 < result.metrics["cpu_seconds"] == result.history[-1]["cpu_seconds"]  # a duration load cannot stretch
    assert "init_accuracy" not in train_and_evaluate(parse_config(BASE)).history[0]
    scratch = train_and_evaluate(parse_config({**BASE, "data": cfg.data.model_dump()}))
    assert result.metrics["accuracy"] > scratch.metrics["accuracy"]  # one epoch from the pretrained model wins


def test_head_reset_reinitialises_only_the_classifier(pretrained, tmp_path):
    folder, _ = pretrained
    saved = checkpoint.load(folder)["model"]
    cfg = parse_config({**BASE, "optim": {"epochs": 1, "lr": 1e-9}, "data": {**BASE["data"], "augment": False},
                        "init": {"checkpoint": str(folder / "state.pt"), "head": "reset"}})
    result = train_and_evaluate(cfg, report=lambda m, save: save(tmp_path))
    after = checkpoint.load(tmp_path)["model"]
    body = [k for k in saved if not k.startswith("fc.") and saved[k].is_floating_point() and "running" not in k
            and "run_" not in k]
    assert body and all(torch.allclose(after[k], saved[k], atol=1e-6) for k in body)
    assert not torch.allclose(after["fc.weight"], saved["fc.weight"], atol=1e-3)
    assert result.history[0]["init_accuracy"] < 0.25  # a fresh classifier: near chance (0.1) before training


@pytest.mark.slow
def test_a_gated_retrain_loads_the_fp32_backbone(pretrained):
    folder, pre = pretrained
    cfg = parse_config({**BASE, "init": {"checkpoint": str(folder)},
                        "schedule": {"kind": "dfq", "options": "paper", "target_cp": 3.0, "execution": "routed"}})
    result = train_and_evaluate(cfg)
    assert result.history[0]["init_accuracy"] == pytest.approx(pre.metrics["accuracy"])


@pytest.mark.slow
def test_another_architectures_checkpoint_is_refused(pretrained, tmp_path, capsys):
    folder, _ = pretrained
    cfg = parse_config({**BASE, "model": {"name": "resnet8"}, "init": {"checkpoint": str(folder)}})
    with pytest.raises(CheckpointError, match="holds a tiny model; allowed: a checkpoint of model.name resnet8"):
        train_and_evaluate(cfg)
    with pytest.raises(CheckpointError, match="does not exist"):
        train_and_evaluate(parse_config({**BASE, "init": {"checkpoint": str(tmp_path / "none")}}))
    conf = tmp_path / "c.yaml"
    conf.write_text(f"model: {{name: resnet8}}\ndata: {{dataset: digits}}\ninit: {{checkpoint: {folder}}}\n")
    for command in (("train", str(conf)), ("validate", str(conf))):
        capsys.readouterr()
        code, _, _ = run_main(*command)
        stderr = capsys.readouterr().err
        errors = [line for line in stderr.splitlines() if "error" in line]
        assert code == 2 and len(errors) == 1, stderr  # one line
        assert "init.checkpoint" in errors[0] and "tiny" in errors[0] and "resnet8" in errors[0]
        assert "Traceback" not in stderr
