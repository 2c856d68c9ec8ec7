"""The fused CPU quantizer kernels (engine/numerics/fused.py, methods.md §1 "Fused kernels"): they load here, give the
torch passes' results bit for bit (quantizers, the generator's draws, whole training runs), and every way they
can be unavailable falls back to the torch passes with a status that says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config.experiment import parse_config
from engine.numerics import fused, quant
from engine.numerics.precision import Precision
from engine.train import train_and_evaluate

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh(monkeypatch):
    """An empty kernel state for this test (the process's own comes back after it)."""
    monkeypatch.setattr(fused, "_state", {})
    return monkeypatch


def test_the_kernels_load_and_pass_their_self_check_here():
    assert fused.status() == "on"
    assert fused.library() is not None


@pytest.mark.parametrize("shape", [(1,), (7,), (1031,), (3, 5, 7, 9), (64, 16, 32, 32), (4, 100003)])
@pytest.mark.parametrize("stochastic", [False, True])
def test_the_per_tensor_quantizer_gives_the_torch_passes_bits(shape, stochastic):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 3 + 0.5
    if x.numel() > 10:
        x.view(-1)[3] = float("nan")
        x.view(-1)[5] = float("inf")
    for bits in (1, 2, 4, 8, 16):
        lo, hi = float(x[x.isfinite()].min()), float(x[x.isfinite()].max())
        torch.manual_seed(bits)
        got = quant.quantize(x, bits, lo, hi, stochastic=stochastic)
        state = torch.get_rng_state()
        with fused.disabled():
            torch.manual_seed(bits)
            want = quant.quantize(x, bits, lo, hi, stochastic=stochastic)
            assert torch.equal(state, torch.get_rng_state())  # the generator ends where torch's draw leaves it
        assert torch.equal(got.nan_to_num(123.0), want.nan_to_num(123.0)), bits
        assert got.isnan().sum() == want.isnan().sum()


@pytest.mark.parametrize("stochastic,ranged", [(False, True), (True, False), (True, True)])
def test_the_row_quantizer_gives_the_torch_passes_bits(stochastic, ranged):
    """Groups of rows at different bits (32 bits: copied), each group's own range or one for all."""
    x = torch.randn(13, 3, 5, 5, generator=torch.Generator().manual_seed(3)) * 2
    x[4, 0, 0, 0] = float("nan")
    groups = ((0, 3, Precision.fwbw(4, 8)), (3, 4, Precision.fwbw(32, 32)), (4, 9, Precision.fwbw(6, 2)),
              (9, 13, Precision.fwbw(2, 16)))
    lo, hi = (float(x.nan_to_num(0).min()), float(x.nan_to_num(0).max())) if ranged else (None, None)
    outs = []
    for on in (True, False):
        torch.manual_seed(11)
        if on:
            outs.append(quant.quantize_rows(x, groups, lambda p: p.grad, lo, hi, stochastic, torch.empty_like(x)))
        else:
            with fused.disabled():
                outs.append(quant.quantize_rows(x, groups, lambda p: p.grad, lo, hi, stochastic, torch.empty_like(x)))
    assert torch.equal(outs[0].nan_to_num(9.0), outs[1].nan_to_num(9.0))
    assert torch.equal(outs[0][3], x[3])  # the 32-bit group passes through


def test_the_generator_is_stepped_as_torch_steps_it():
    """``random_words`` against ``random_`` from every position in a block of mt19937's state, for lengths that
    end inside a block, on its edge and several blocks on."""
    for before in (0, 1, 2, 311, 622, 623, 624, 625, 1000):
        for n in (0, 1, 2, 311, 312, 313, 624, 1249, 5000):
            torch.manual_seed(before + 7 * n)
            torch.rand(before)
            start = torch.get_rng_state()
            want = torch.empty(n, dtype=torch.int64).random_(-(2**63), None)
            after = torch.get_rng_state()
            torch.set_rng_state(start)
            got = fused.random_words(torch.empty(n, dtype=torch.int64))
            assert torch.equal(got, want), (before, n)
            assert torch.equal(torch.get_rng_state(), after), (before, n)


@pytest.mark.parametrize("schedule", [{"kind": "static", "fw": 6, "bw": 8},
                                      {"kind": "dfq", "target_cp": 3.0, "execution": "routed"},
                                      {"kind": "dfq", "target_cp": 3.0, "execution": "routed",
                                       "routed_statistics": "computed"},
                                      {"kind": "fractrain", "execution": "routed"}],
                         ids=["fw6bw8", "dfq_routed", "dfq_routed_computed", "fractrain_routed"])
@pytest.mark.slow
def test_a_run_is_the_same_bit_for_bit_with_and_without_the_kernels(schedule):
    figures = []
    for on in (True, False):
        cfg = parse_config({"name": "fused", "model": {"name": "resnet8"}, "optim": {"epochs": 1},
                            "data": {"dataset": "digits", "batch_size": 64}, "schedule": schedule})
        if on:
            result = train_and_evaluate(cfg)
        else:
            with fused.disabled():
                result = train_and_evaluate(cfg)
        figures.append({k: v for k, v in result.metrics.items() if k not in ("wall_seconds", "cpu_seconds")})
    assert figures[0]["accuracy"] > 0.5
    assert figures[0] == figures[1]


def test_off_by_the_switch_without_a_compiler_or_with_a_failing_one(fresh, tmp_path):
    fresh.setenv("FRACTUNE_FUSED", "off")
    assert fused.status() == "off (FRACTUNE_FUSED=off)" and fused.library() is None
    x = torch.randn(5, 7)
    assert torch.equal(quant.quantize(x, 4, -1.0, 1.0), quant.quantize(x, 4, -1.0, 1.0))  # the torch passes

    fresh.setattr(fused, "_state", {})
    fresh.delenv("FRACTUNE_FUSED")
    fresh.delenv("CC", raising=False)
    fresh.setenv("PATH", str(tmp_path))  # no cc, no gcc
    assert fused.status() == "off (no C compiler: set CC, or install gcc)"

    fresh.setattr(fused, "_state", {})
    fresh.setenv("CC", "/bin/false")  # a "compiler" that fails
    fresh.setenv("FRACTUNE_CACHE_DIR", str(tmp_path / "cache"))
    assert fused.status().startswith("off (RuntimeError: /bin/false failed")
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written left behind


def test_a_failed_self_check_turns_the_kernels_off(fresh, tmp_path):
    fresh.setenv("FRACTUNE_CACHE_DIR", str(tmp_path))
    fresh.setattr(fused, "_self_check", lambda lib: "fq_rows differs from torch")
    assert fused.status() == "off (self-check: fq_rows differs from torch)" and fused.library() is None


@pytest.mark.parametrize("cache", ["unwritable", "shared", "a_file"])
@pytest.mark.slow
def test_an_unusable_cache_builds_in_a_private_folder(cache, fresh, tmp_path):
    """A cache folder that cannot be written, that others can write, or that is a file: the library is built
    in a private folder for this process, and nothing is loaded from or left in the bad one."""
    target = {"unwritable": Path("/proc/nonexistent/cache"), "shared": tmp_path / "shared",
              "a_file": tmp_path / "file"}[cache]
    if cache == "shared":
        target.mkdir(mode=0o777)
        target.chmod(0o777)
    if cache == "a_file":
        target.write_text("not a folder")
    fresh.setenv("FRACTUNE_CACHE_DIR", str(target))
    assert fused.status() == "on"
    if cache == "shared":
        assert not list(target.iterdir())


@pytest.mark.slow
def test_processes_compiling_into_one_cache_at_once_all_load_it(tmp_path):
    """Three processes start on an empty cache together: each builds under a private name and renames it into
    place, so all of them load a whole library and one file is left."""
    env = {**os.environ, "FRACTUNE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    code = "from engine.numerics import fused; print(fused.status())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [o[0].strip() for o in outs] == ["on"] * 3, [o[1][-500:] for o in outs]
    assert len(list(tmp_path.glob("fused-*.so"))) == 1 and not list(tmp_path.glob(".fused-*"))


@pytest.mark.slow
def test_a_bad_switch_value_is_refused_before_the_command_starts(run_cli):
    r = run_cli("validate", str(ROOT / "examples" / "fmnist_dfq.yaml"), env={"FRACTUNE_FUSED": "maybe"},
                timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "FRACTUNE_FUSED" in lines[0] and "'maybe'" in lines[0] and "off" in lines[0]
    assert fused.environment_problem() is None  # this process's own value is fine
