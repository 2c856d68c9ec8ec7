"""engine.optim against torch.optim: the same parameters bit for bit after every step, and state dicts that load
either way and continue identically."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from engine import optim
from tests.conftest import ROOT

SETTINGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "nesterov": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
    ("Adam", {"lr": 1e-3, "betas": (0.9, 0.98), "eps": 1e-9}),
    ("Adam", {"lr": 3e-3, "betas": (0.8, 0.999), "eps": 1e-8, "weight_decay": 1e-2}),
]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 10, bias=False))


def _steps(model, opt, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
        for group in opt.param_groups:  # as the training loop does: a new learning rate every iteration
            group["lr"] = group["lr"] * 0.97
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if i == 2:  # a parameter without a gradient this step is left alone, as torch.optim leaves it
            model[0].bias.grad = None
        opt.step()


def _through_a_file(state: dict) -> dict:
    """As a checkpoint carries it: saved, then loaded with ``weights_only=True``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("name, kwargs", SETTINGS)
def test_every_step_is_bit_identical_to_torch_optim(name, kwargs):
    ours, theirs = _model(), _model()
    _steps(ours, getattr(optim, name)(ours.parameters(), **kwargs), 7)
    _steps(theirs, getattr(torch.optim, name)(theirs.parameters(), **kwargs), 7)
    assert _same(ours, theirs)
    assert not _same(ours, _model())  # it trained


@pytest.mark.parametrize("name, kwargs", SETTINGS)
@pytest.mark.parametrize("first, then", [(torch.optim, optim), (optim, torch.optim)])
def test_a_state_dict_of_either_loads_in_the_other_and_continues_identically(name, kwargs, first, then):
    """A checkpoint written with torch.optim resumes under engine.optim (and back) exactly as it would have."""
    a, b = _model(), _model()
    opt_a = getattr(first, name)(a.parameters(), **kwargs)
    _steps(a, opt_a, 4)
    b.load_state_dict(a.state_dict())
    opt_b = getattr(then, name)(b.parameters(), **kwargs)
    opt_b.load_state_dict(_through_a_file(opt_a.state_dict()))
    assert opt_b.param_groups[0]["lr"] == opt_a.param_groups[0]["lr"] != kwargs["lr"]
    _steps(a, opt_a, 3, seed=2)
    _steps(b, opt_b, 3, seed=2)
    assert _same(a, b)


def test_a_state_of_another_model_is_refused():
    opt = optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)
    other = optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="does not match"):
        opt.load_state_dict(other.state_dict())


@pytest.mark.slow
def test_training_loads_no_torch_dynamo():
    """The reason the module exists: a training process (a trial actor, `fractune train`) never imports
    torch._dynamo, which torch.optim imports on first use."""
    code = ("import sys; from engine import train_and_evaluate; from engine.config import ExperimentConfig;"
            "cfg = ExperimentConfig.model_validate({'model': {'name': 'tiny'}, 'data': {'dataset': 'digits',"
            "'batch_size': 256}, 'optim': {'epochs': 1, 'momentum': 0.9}, 'schedule': {'kind': 'static', 'fw': 4,"
            "'bw': 8}}); train_and_evaluate(cfg); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
