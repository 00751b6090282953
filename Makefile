# gearshift: `make train` then `make test` is the whole set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install train test test-all bench lint format clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed ## create .venv and install gearshift with its dev tools

train: $(VENV)/.installed ## train on the default config (ARGS="amp=on accum=4" to switch gears)
	$(PY) train.py $(ARGS)

test: $(VENV)/.installed ## the fast test suite
	$(PY) -m pytest -m "not slow" $(ARGS)

test-all: $(VENV)/.installed ## every test, the slow ones too
	$(PY) -m pytest $(ARGS)

bench: $(VENV)/.installed ## template loop vs a hand-written loop, interleaved; prints ratios
	$(PY) scripts/bench.py $(ARGS)

lint: $(VENV)/.installed ## ruff lint and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.installed ## apply ruff's fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean: ## remove run folders and caches (keeps .venv)
	rm -rf runs multirun outputs .pytest_cache .ruff_cache
