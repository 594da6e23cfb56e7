# The commands of the README (demo, test, docs). Each creates .venv when missing and installs nsl into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nsl-installed
DEMO_DIR ?= runs/demo

.PHONY: demo test docs install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# [tpu] brings libtpu: the ahead-of-time TPU compile tests (nsl.compile) run on any host.
	# [docs] brings MkDocs and its Material theme: `make test` builds the documentation strictly.
	$(PY) -m pip install --quiet -e ".[dev,tpu,docs,hf]"
	# The CPU kernels (attention, head, decode; C++, -march=native) are built now so a compiler problem shows here;
	# without one, both run their XLA paths (a warning, not a failure).
	$(PY) -m nsl.kernels.cpu_build || echo "nsl: CPU kernels not built; attention, the head and decoding will run the XLA paths"
	touch $(STAMP)

install: $(STAMP)

# Trains configs/tiny.py (the launcher prepares the embedded corpus into data/ on first use and
# reuses it after), prints the validation NLL next to the corpus's unigram entropy, and writes
# $(DEMO_DIR)/loss_curve.png. A second `make demo` resumes/finishes the same run: remove
# $(DEMO_DIR) to train again from scratch.
demo: $(STAMP)
	$(PY) -m nsl.launch --config=configs/tiny.py --workdir=$(DEMO_DIR)
	$(PY) -m nsl.report $(DEMO_DIR)

# Two workers (CI has 2 cores); a test file stays on one worker so its module fixtures run once.
# Files are handed out in collection order (tests/conftest.py puts the end-to-end ones first), not
# xdist's largest-file-first, which left the one-test, minutes-long tiny-grid file to run last, alone.
# --durations: the slowest tests end every run's output, so the suite's budget is watched where CI runs.
TEST_WORKERS ?= 2
test: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(VENV)/site
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 tests

# The documentation site (mkdocs.yml, docs/): served with live reload at http://127.0.0.1:8000.
DOCS_ADDR ?= 127.0.0.1:8000
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

clean:
	rm -rf $(VENV) runs data site
