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

# torch (foxcute.torch's tests), where none is installed, only as a local CPU build: PyPI has
# no "+cpu" versions, so this never pulls a multi-GB CUDA build (nor replaces an installed
# one); where none is offered the torch tests skip
$(INSTALLED): pyproject.toml | $(VENV_PYTHON)
	$(VENV_PYTHON) -m pip install --upgrade pip
	$(VENV_PYTHON) -m pip install -e ".[test,lab]"
	$(VENV_PYTHON) -c "import torch" 2>/dev/null || $(VENV_PYTHON) -m pip install "torch==2.13.0+cpu" \
		|| echo "no local CPU build of torch: the torch tests skip"
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
