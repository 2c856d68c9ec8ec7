#!/bin/bash
# The GPU suite on a lent GPU machine, run from the checkout's root there (the device tool's `run`, carrying
# `.whl`, which bench/gpu_wheels.sh fills here): installs the carried wheels, then runs bench/gpu_suite.py with
# its arguments on the machine's own torch and Triton. Into $OUT: the suite's output, its last line (the JSON
# docs/benchmarks.md takes its GPU figures from) and nvidia-smi's list of GPUs.
set -euo pipefail
out=${OUT:-.}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=$PWD:/tmp/site
fi
nvidia-smi -L >"$out/nvidia_smi.txt" 2>&1 || true
python3 bench/gpu_suite.py "$@" 2>"$out/gpu_suite.err" | tee "$out/gpu_suite.log"
tail -n 1 "$out/gpu_suite.log" >"$out/gpu_suite.json"
