"""bench/gpu_suite.py, the prepared GPU measurement, runs end to end before a GPU is lent: its quick smoke test on
the CPU gives every path of every kind, the ratios against FP32, the compile times and one JSON line; and the
Triton kernels it measures compile for a GPU (bench/triton_aot.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_the_gpu_suite_runs_its_smoke_test_on_the_cpu_and_reports_every_path():
    r = subprocess.run([sys.executable, "bench/gpu_suite.py", "--quick", "--skip-accuracy", "--device", "cpu",
                        "--models", "transformer_tiny"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bench"] == "gpu_suite" and out["device"] == "cpu" and out["triton"]
    model = out["models"]["transformer_tiny"]
    for kind in ("fw8bw8", "cpt"):
        for path in ("torch", "kernels", "compiled", "best"):
            assert model["ratios"][f"{kind}_{path}"] > 0
    for kind in ("dfq_routed", "dfq_masked"):
        assert {f"{kind}_torch", f"{kind}_kernels", f"{kind}_best"} <= set(model["ratios"])
    assert model["ratios"]["routed_to_masked"] > 0
    assert set(model["compile_s"]) == {"fp32_compiled", "fw8bw8_compiled", "cpt_compiled"}
    assert model["compile_mode"] == "default" and model["host_syncs_per_step"] is None
    assert out["bit_check_differing_values"] == {"skipped": "the kernels do not run on cpu here"}


@pytest.mark.slow
def test_every_kernel_variant_compiles_for_a_hopper_gpu_without_one():
    """bench/triton_aot.py: the kernels through Triton's compiler to sm_90 machine code, every variant the
    wrappers launch; the interpreter that runs them in the other tests never compiles them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "bench/triton_aot.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["target"] == "sm_90" and out["errors"] == []
    assert out["kernels"] == ["partial_range", "quant_channel", "quant_rows", "quant_tensor", "row_range"]
    assert out["compiled"] == out["variants"] >= 20  # both modes of each flag, BLOCK and PARTS over their range
