# gearshift: `make train` then `make test` is the whole set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# pytest-xdist workers: one per core; the SLURM tests share one (their xdist_group)
WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(WORKERS) --dist loadgroup --durations=15

.DEFAULT_GOAL := help
.PHONY: help install train test test-all bench bench-data ablation report docs docs-serve slurm-up slurm-down docker lint format clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed ## create .venv and install gearshift with its dev tools

train: $(VENV)/.installed ## train on the default config (ARGS="amp=on accum=4" to switch gears)
	$(PY) train.py $(ARGS)

test: $(VENV)/.installed ## the fast test suite; prints the 15 slowest tests
	$(PYTEST) -m "not slow" $(ARGS)

test-all: $(VENV)/.installed ## every test, the slow ones too
	$(PYTEST) $(ARGS)

bench: $(VENV)/.installed ## template loop vs a hand-written loop, interleaved; prints ratios
	$(PY) scripts/bench.py $(ARGS)

bench-data: $(VENV)/.installed ## image loaders vs the torchvision recipe on generated JPEGs, interleaved (ARGS="--workers 4")
	$(PY) scripts/bench_data.py $(ARGS)

ablation: $(VENV)/.installed ## baseline, each gear alone, all gears, in rounds; then its report (DIR=, ARGS=sweep.rounds=N)
	@dir="$(or $(DIR),multirun/ablation_$$(date +%Y-%m-%d_%H-%M-%S))"; \
	$(PY) train.py -m sweep=ablation hydra.sweep.dir="$$dir" $(ARGS); status=$$?; \
	$(PY) scripts/report.py "$$dir" && exit $$status

report: $(VENV)/.installed ## a sweep folder's report (gear ablation or Optuna study): make report DIR=multirun/<sweep>
	@test -n "$(DIR)" || { echo "usage: make report DIR=<sweep folder>" >&2; exit 2; }
	$(PY) scripts/report.py "$(DIR)"

docs: $(VENV)/.installed ## build the manual (MkDocs Material) into site/; --strict: a broken link or anchor fails
	@$(PY) -c "import mkdocs, material" 2>/dev/null || $(PY) -m pip install --quiet -e '.[docs]'
	$(PY) -m mkdocs build --strict

docs-serve: $(VENV)/.installed ## serve the manual at http://127.0.0.1:8000, rebuilt on every edit
	@$(PY) -c "import mkdocs, material" 2>/dev/null || $(PY) -m pip install --quiet -e '.[docs]'
	$(PY) -m mkdocs serve

slurm-up: ## start a two-node SLURM cluster on this machine (root; installs slurm + munge)
	bash scripts/slurm/up.sh

slurm-down: ## stop that cluster
	bash scripts/slurm/down.sh

docker: ## build the CUDA image (needs a Docker engine): docker run --gpus all gearshift amp=on
	docker build -t gearshift .

lint: $(VENV)/.installed ## ruff, the import-layer contract (import-linter), hadolint on the Dockerfile
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile

format: $(VENV)/.installed ## apply ruff's fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean: ## remove run folders and caches (keeps .venv)
	rm -rf runs multirun outputs site .pytest_cache .ruff_cache
