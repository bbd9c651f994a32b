# The README's two commands:  `make repro`  and  `make test`.
# `make install` creates .venv from the pinned lock (requirements.lock); it reruns only
# when the lock or pyproject.toml change.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Stage commands say `python -m ...`: run DVC with the venv first on PATH.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install repro test reprocheck params bench clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

repro: install
	$(BIN)/dvc repro

test: install
	$(BIN)/python -m pytest -q

# Does this machine reproduce the committed bytes? The DAG on env=tiny in a scratch copy vs
# .ci/repro_tiny.json (what CI runs after the tests; docs/reproducibility.md).
reprocheck: install
	$(BIN)/python -m pipeline.tools.reprocheck --scratch env=tiny --golden .ci/repro_tiny.json

params: install
	$(BIN)/python -m pipeline.core.config compose

bench: install
	$(BIN)/python -m benchmarks

clean-venv:
	rm -rf $(VENV)
