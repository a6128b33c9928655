# speedkit: `make demo` and `make test` set everything up on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.speedkit-installed
DEMO_STAMP := $(VENV)/.speedkit-demo-installed
PYTEST_ARGS ?=

.PHONY: setup system demo test lab readme docs clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# Outside CI a missing system package only skips the tests that need it (the script said what to install);
# under CI=true it stops here, so a green CI means every test ran.
system:
	@bash scripts/setup-system.sh || case "$$CI" in true|TRUE|True|1|yes) exit 1;; *) echo "setup: continuing without them";; esac

setup: $(STAMP) system

# The demo needs only speedkit[demo] (papermill, the notebook widgets, matplotlib), not the whole dev set.
$(DEMO_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[demo]'
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP) system
	$(PY) -m speedkit demo --root .

# Two processes, one per core: the notebooks (one file, run in order, their speed checks paired within each
# notebook) beside everything else; one torch thread each, since two processes of two threads would only
# wait on one another. TEST_WORKERS=0 runs the suite in this process, as plain pytest does.
TEST_WORKERS ?= 2
# A file's tests run on one worker, in the order tests/conftest.py gives them (the longest files first).
WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(WORKERS) $(PYTEST_ARGS)

# JupyterLab refuses to start as root ("Use --allow-root to bypass"); containers often run as root.
LAB_ARGS ?= $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

lab: setup
	$(VENV)/bin/jupyter lab $(LAB_ARGS) notebooks

readme: setup
	$(PY) scripts/update_readme.py README.md
	$(PY) scripts/draw_results_figure.py

# The API reference (pdoc, offline) with a page per method from its card; fails on a broken reference.
docs: setup
	$(PY) scripts/build_docs.py build/docs

clean:
	rm -rf runs .pytest_cache .hypothesis
