# Two commands for a fresh machine: `make test` and `make demo`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export KERAS_TRANSFORMER_DATA ?= $(abspath ../shared/data/multi30k)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install test test-all demo clean

$(BIN)/keras-transformer: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,serving]'
	touch $@

install: $(BIN)/keras-transformer

test: install  ## the default test suite (slow tests skipped)
	$(BIN)/python -m pytest -q

test-all: install  ## every test, including the slow ones
	$(BIN)/python -m pytest -q -m ""

demo: install  ## the main job on real Multi30k German-English
	bash experiments/demo.sh

clean:
	rm -rf $(VENV) *.egg-info runs/demo
