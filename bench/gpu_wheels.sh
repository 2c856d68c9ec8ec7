#!/bin/sh
# Fetches into .whl/ the wheels a lent GPU machine lacks for bench/gpu_device.sh: pydantic and its needs (the
# engine's config), at the project's own versions, for that machine's Python 3.12 on x86-64. Run here, where
# pip reaches a registry; the GPU machine reaches none.
set -eu
PIN=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null |
      grep -i -E '^(pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|typing[-_]extensions)==')
rm -rf .whl
# shellcheck disable=SC2086 # one argument per pinned package
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $PIN
ls .whl
