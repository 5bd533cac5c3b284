# `make test` and `make demo` each do all set-up on a fresh machine: a .venv with the pinned
# torch installed first, then qkan from its sdist without its CUDA extension, then this project
# with every extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qkan-pack-installed
TORCH_PIN := torch==2.13.0
QKAN_PIN := qkan==0.2.3

# Where torch comes from. PyPI's `torch` is the CUDA build (several GB, and its Triton: torch
# 2.13.0 brings Triton 3.7.1), right for a GPU host and wrong elsewhere; so a host without an
# NVIDIA driver (no nvidia-smi) takes the CPU build from PyTorch's CPU index. torch is installed
# alone from that index, then its dependencies from the usual one: --index-url, so that an
# index that does not answer fails the install instead of falling back to PyPI's CUDA build;
# --retries 0, so that a host that reaches package registries only (this project's CI, which
# keeps the pin's CPU wheel in pip's find-links, where pip still looks) loses no time on it.
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cu130   # another build
#   make test TORCH_INDEX=                                          # what `pip install torch` takes
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,https://download.pytorch.org/whl/cpu)
# $(call install-torch,PYTHON[,PIP OPTIONS]): TORCH_PIN into PYTHON's environment, as above.
install-torch = $(if $(TORCH_INDEX),$(1) -m pip install -q $(2) --no-deps --retries 0 \
	--index-url $(TORCH_INDEX) $(TORCH_PIN) && )$(1) -m pip install -q $(2) $(TORCH_PIN)

# The newest Triton the kernel seam supports (qkan_pack/_supported.py), unpacked beside the
# venv, not in it: the suite runs without Triton, as on any CPU host, and
# tests/runtime/test_triton_releases.py runs the seam against this package in a subprocess
# (Triton imports and hashes itself without a GPU); QKAN_PACK_TRITON_SITE makes that required.
TRITON_PIN := triton==3.7.1
TRITON_SITE := $(VENV)/triton-site
TRITON_STAMP := $(TRITON_SITE)/.installed

# What users install, as they get it: the sdist and the wheel built from it (dist/), the wheel
# installed (not editable) into a fresh venv with only its own dependencies and torch;
# tests/test_wheel.py runs README's quick start there, outside the checkout. No bytecode is
# compiled at install (most of the install's time): Python compiles what the test imports.
WHEEL_VENV := build/wheel-venv

.PHONY: test test-fast demo lint docs clean bench-reference wheel

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(call install-torch,$(PY))
	QKAN_SKIP_CUDA_BUILD=TRUE $(PY) -m pip install -q --no-build-isolation $(QKAN_PIN)
	$(PY) -m pip install -q -e '.[test,bench,serve,grpc,qkan,sign,docs]'
	touch $(STAMP)

$(TRITON_STAMP): Makefile | $(STAMP)
	rm -rf $(TRITON_SITE)
	$(PY) -m pip install -q --no-deps --target $(TRITON_SITE) $(TRITON_PIN)
	touch $@

wheel: $(STAMP)
	rm -rf dist $(WHEEL_VENV)
	$(PY) -m build --outdir dist .
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(call install-torch,$(WHEEL_VENV)/bin/python,--no-compile)
	$(WHEEL_VENV)/bin/python -m pip install -q --no-compile dist/*.whl

test: $(STAMP) $(TRITON_STAMP) wheel
	$(PY) -m ruff check qkan_pack tests examples mkdocs_hooks.py
	$(VENV)/bin/lint-imports
	$(PY) -m mypy
	site=$$(mktemp -d) && $(VENV)/bin/mkdocs build --strict --site-dir "$$site"; \
		status=$$?; rm -rf "$$site"; exit $$status
	QKAN_PACK_TRITON_SITE=$(abspath $(TRITON_SITE)) QKAN_PACK_WHEEL_VENV=$(abspath $(WHEEL_VENV)) \
		$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(PY) -m ruff check qkan_pack tests examples mkdocs_hooks.py
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

# The manual (docs/, mkdocs.yml) as a site in build/site/; strict: a broken link, a missing
# anchor or a page left out of the navigation fails.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) $(WHEEL_VENV) dist artifacts/*/ .pytest_cache .mypy_cache

# The reference benchmarks on a GPU host: JSON + PNG per model into benchmarks/results/.
RESULTS ?= benchmarks/results
DATE := $(shell date +%F)
bench-reference: $(STAMP)
	$(PY) -m qkan_pack build examples/qkan_mlp.py --shapes 1x2,64x2 -o artifacts/ref_qkan_2_8_2 --force
	$(PY) -m qkan_pack build examples/qkan_mlp.py --shapes 1x64,256x64 --config 'width=[64,64,64]' \
		--config reps=3 -o artifacts/ref_qkan_64_r3 --force
	$(PY) -m qkan_pack build examples/hqkan_gpt.py --shapes 1x128,8x128 --dtype int64 \
		-o artifacts/ref_hqkan_gpt --force
	for m in qkan_2_8_2 qkan_64_r3 hqkan_gpt; do \
		$(PY) -m qkan_pack bench artifacts/ref_$$m --device cuda --json $(RESULTS)/$(DATE)_bench_$$m.json \
			--plot $(RESULTS)/$(DATE)_bench_$$m.png || exit 1; done
