# Two commands set everything up on a fresh machine (see README):
#   make demo   creates .venv, installs torch (CPU) and seqrec, runs the main job
#   make test   creates .venv with the dev extras, runs lint, types and the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
# The shared data folder of this workspace, when present, is the default data directory;
# seqrec itself then looks in $SEQREC_DATA_DIR and the cache.
DATA_DIR ?= $(wildcard ../shared/data)
DATA_FLAG := $(if $(DATA_DIR),--data-dir $(DATA_DIR),)

.PHONY: demo test lint venv clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core: $(BIN)/activate pyproject.toml
	$(BIN)/pip install --quiet --disable-pip-version-check $(TORCH)
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(VENV)/.dev: $(VENV)/.core
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,parquet,plot,text,numba,serve]'
	touch $@

venv: $(VENV)/.dev

demo: $(VENV)/.core
	$(BIN)/seqrec demo $(DATA_FLAG) --out runs/demo

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
