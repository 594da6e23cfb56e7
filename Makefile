# The commands of the README (demo, test, docs). Each creates .venv when missing and installs nsl into it,
# at one of two levels, each with its own stamp: core (`pip install -e .`, what training needs: the demo)
# and full (core plus the extras the tests and the docs site need). Full is a superset of core, so the
# demo's venv and the test venv are one .venv: `make test` after `make demo` adds the extras only.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE_STAMP := $(VENV)/.nsl-core
FULL_STAMP := $(VENV)/.nsl-full
FULL_EXTRAS := dev,tpu,docs,hf
DEMO_DIR ?= runs/demo
DEMO_CONFIG ?= configs/demo.py

.PHONY: demo test docs install install-core clean

# The CPU kernels (attention, head, decode; C++, -march=native, about 10 s) are built with the core install so a
# compiler problem shows here; without a compiler they run their XLA paths (a warning, not a failure).
$(CORE_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m nsl.kernels.cpu_build || echo "nsl: CPU kernels not built; attention, the head and decoding will run the XLA paths"
	touch $(CORE_STAMP)

# [tpu] brings libtpu: the ahead-of-time TPU compile tests (nsl.compile) run on any host.
# [docs] brings MkDocs and its Material theme: `make test` builds the documentation strictly.
# [hf] brings torch and transformers: the Hugging Face export is checked against LlamaForCausalLM.
$(FULL_STAMP): $(CORE_STAMP)
	$(PY) -m pip install --quiet -e ".[$(FULL_EXTRAS)]"
	touch $(FULL_STAMP)

install-core: $(CORE_STAMP)
install: $(FULL_STAMP)

# Trains configs/demo.py (configs/tiny.py's model for fewer steps; the launcher prepares the embedded
# corpus into data/ on first use and reuses it after), prints the validation NLL next to the corpus's
# unigram entropy, and writes $(DEMO_DIR)/loss_curve.png. Core dependencies only: no extra is needed.
# A second `make demo` resumes/finishes the same run: remove $(DEMO_DIR) to train again from scratch.
demo: $(CORE_STAMP)
	$(PY) -m nsl.launch --config=$(DEMO_CONFIG) --workdir=$(DEMO_DIR)
	$(PY) -m nsl.report $(DEMO_DIR)

# Two workers (CI has 2 cores); a test file stays on one worker so its module fixtures run once.
# Files are handed out in collection order (tests/conftest.py puts the end-to-end ones first), not
# xdist's largest-file-first, which left the one-test, minutes-long tiny-grid file to run last, alone.
# --durations: the slowest tests end every run's output, so the suite's budget is watched where CI runs.
TEST_WORKERS ?= 2
test: $(FULL_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(VENV)/site
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 tests

# The documentation site (mkdocs.yml, docs/): served with live reload at http://127.0.0.1:8000.
DOCS_ADDR ?= 127.0.0.1:8000
docs: $(FULL_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

clean:
	rm -rf $(VENV) runs data site
