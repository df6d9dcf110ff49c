# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then train SmolLM2-135M-Instruct with GRPO on arithmetic (CPU, ~15 min)
#   make test   set up .venv, then run the test suite
VENV ?= .venv
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-fast

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/posttrain train examples/arithmetic_grpo.yaml --overwrite

test: setup
	$(VENV)/bin/python -m pytest -q -ra

test-fast: setup
	$(VENV)/bin/python -m pytest -q -m "not slow"
