#!/bin/bash
# The GPU suite on a lent GPU machine, run from the checkout's root there (the device tool's `run`, carrying
# `.gpu-carry`, which bench/gpu_carry.sh fills here): installs the carried wheels, then runs bench/gpu_suite.py
# on the machine's own torch and Triton, with the carried corpus for the language-model runs and the arguments
# given here. Into $OUT: the suite's output, its last line (the JSON docs/benchmarks.md takes its GPU figures
# from) and nvidia-smi's list of GPUs.
set -euo pipefail
out=${OUT:-.}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if compgen -G ".gpu-carry/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu-carry/wheels/*.whl
  PYTHONPATH=$PWD:/tmp/site
fi
if ! python3 -c "import pydantic" 2>/dev/null; then
  echo "error: no pydantic here: run bench/gpu_carry.sh where pip reaches a registry and carry .gpu-carry" >&2
  exit 2
fi
text=()
if [ -d .gpu-carry/fortunes ]; then text=(--text-dir .gpu-carry/fortunes); fi
nvidia-smi -L >"$out/nvidia_smi.txt" 2>&1 || true
python3 bench/gpu_suite.py "${text[@]}" "$@" 2>"$out/gpu_suite.err" | tee "$out/gpu_suite.log"
tail -n 1 "$out/gpu_suite.log" >"$out/gpu_suite.json"
