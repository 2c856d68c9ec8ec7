#!/bin/sh
# Fills .gpu-carry/ (ignored) with what a lent GPU machine lacks for bench/gpu_device.sh, which reaches no
# registry: the wheels of pydantic and its needs (the engine's config), at the project's own versions, for that
# machine's Python 3.12 on x86-64; and the fortunes corpus of cuda_check's language-model runs (FORTUNE_FILES in
# FORTUNES_DIR, engine/data/text.py). Run here, where pip reaches a registry.
set -eu
PIN=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null |
      grep -i -E '^(pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|typing[-_]extensions)==')
rm -rf .gpu-carry
mkdir -p .gpu-carry/fortunes
# shellcheck disable=SC2086 # one argument per pinned package
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu-carry/wheels $PIN
for path in $(.venv/bin/python -c "from engine.data.text import FORTUNE_FILES, FORTUNES_DIR
print(*(FORTUNES_DIR / name for name in FORTUNE_FILES))"); do
  cp -L "$path" .gpu-carry/fortunes/
done
du -sh .gpu-carry
