# Two commands on a fresh machine with python3 and git:
#   make test   all tests (GPU tests skip without a GPU)
#   make run    the notebooks through papermill (preset auto: h200 on a GPU, else cpu)
# Both create .venv on first use; the install reruns only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
RUN_ARGS ?= --preset auto

.PHONY: test run lab

$(VENV_PYTHON):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(VENV_PYTHON)
	$(VENV_PYTHON) -m pip install --upgrade pip
	$(VENV_PYTHON) -m pip install -e ".[test,lab]"
	touch $@

# one test process per core (CI has 2): the compile-bound tests of one file share a process and
# its compiled kernels (--dist loadfile)
TEST_WORKERS ?= auto

test: $(INSTALLED)
	$(VENV_PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadfile

run: $(INSTALLED)
	$(VENV_PYTHON) -m foxcute run $(RUN_ARGS)

# JupyterLab on the notebooks, in the same environment (Jupyter refuses to run as root without --allow-root)
lab: $(INSTALLED)
	cd notebooks && ../$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root)
