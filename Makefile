# `make test` and `make demo` each do all set-up on a fresh machine: a .venv with the pinned
# CPU torch installed first (a bare `torch` requirement would pull a multi-GB CUDA build),
# then qkan from its sdist without its CUDA extension, then this project with every extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qkan-pack-installed
TORCH_PIN := torch==2.13.0
QKAN_PIN := qkan==0.2.3

.PHONY: test test-fast demo lint docs clean bench-reference

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $(TORCH_PIN)
	QKAN_SKIP_CUDA_BUILD=TRUE $(PY) -m pip install -q --no-build-isolation $(QKAN_PIN)
	$(PY) -m pip install -q -e '.[test,bench,serve,grpc,qkan,sign,docs]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check qkan_pack tests examples mkdocs_hooks.py
	$(VENV)/bin/lint-imports
	site=$$(mktemp -d) && $(VENV)/bin/mkdocs build --strict --site-dir "$$site"; \
		status=$$?; rm -rf "$$site"; exit $$status
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(PY) -m ruff check qkan_pack tests examples mkdocs_hooks.py
	$(VENV)/bin/lint-imports

# The manual (docs/, mkdocs.yml) as a site in build/site/; strict: a broken link, a missing
# anchor or a page left out of the navigation fails.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) artifacts/*/ .pytest_cache

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
