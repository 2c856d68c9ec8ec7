#!/bin/sh
# The GPU suite's smoke test (bench/gpu_suite.py --quick, on the CPU) and the kernels' compile for sm_90
# (bench/triton_aot.py) under the GPU machines' own torch and Triton, in a venv of its own (.gpu-compat/): what
# their older versions cannot run fails here, before a GPU is lent.
# The wheels (about 720 MB) download once. torch's CUDA build loads CUDA's libraries at import, so they come from
# the project's venv; no GPU is used. GPU_TORCH, GPU_TRITON and GPU_PYTHON choose the versions and the interpreter.
set -eu
TORCH=${GPU_TORCH:-2.11.0}
TRITON=${GPU_TRITON:-3.6.0}
PY=${GPU_PYTHON:-python3}
DIR=.gpu-compat
VENV=$DIR/torch-$TORCH-triton-$TRITON
if [ ! -f "$VENV/.ready" ]; then  # set up whole or again: a setup cut short leaves no stamp
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --no-deps "torch==$TORCH" "triton==$TRITON"
  "$VENV/bin/pip" install --quiet numpy pydantic pyyaml filelock typing-extensions sympy networkx jinja2 fsspec \
    "setuptools<82" scikit-learn
  libs=$(.venv/bin/python -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))" 2>/dev/null) || {
    echo "error: .venv has no CUDA libraries (package nvidia) for torch $TORCH's CUDA build to load; install the" \
      "project's torch from PyPI (make install)" >&2
    rm -rf "$VENV"
    exit 1
  }
  mkdir -p "$DIR/cuda-libs"
  ln -sfn "$libs/nvidia" "$DIR/cuda-libs/nvidia"
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$PWD/$DIR/cuda-libs" > "$site/zz_cuda_libs.pth"
  touch "$VENV/.ready"
fi
PYTHONPATH=$PWD "$VENV/bin/python" bench/triton_aot.py
PYTHONPATH=$PWD "$VENV/bin/python" bench/gpu_suite.py --quick --device cpu "$@"
