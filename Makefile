# `make test` and `make demo` each do all set-up on a fresh machine: a .venv with the pinned
# CPU torch installed first (a bare `torch` requirement would pull a multi-GB CUDA build),
# then qkan from its sdist without its CUDA extension, then this project with test extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qkan-pack-installed
TORCH_PIN := torch==2.13.0
QKAN_PIN := qkan==0.2.3

.PHONY: test test-fast demo lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $(TORCH_PIN)
	QKAN_SKIP_CUDA_BUILD=TRUE $(PY) -m pip install -q --no-build-isolation $(QKAN_PIN)
	$(PY) -m pip install -q -e '.[test,bench,serve]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check qkan_pack tests examples benchmarks
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(PY) -m ruff check qkan_pack tests examples benchmarks

clean:
	rm -rf $(VENV) artifacts/*/ .pytest_cache
