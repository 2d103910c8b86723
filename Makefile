# Two commands for a fresh machine: `make test` and `make demo`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export KERAS_TRANSFORMER_DATA ?= $(abspath ../shared/data/multi30k)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install test test-all demo docs guide clean

$(BIN)/keras-transformer: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,serving,ctranslate2,docs]'
	touch $@

install: $(BIN)/keras-transformer

# Two pytest workers, each keeping a test file to itself (module-scoped tokenizer fixtures stay
# in one process); the slowest tests are listed. Timings: experiments/log.
PYTEST_ARGS ?= -n 2 --dist loadfile --durations=10

test: install  ## the import contract (setup.cfg [importlinter]), then the test suite
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-all: install  ## every test, including the slow ones
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

demo: install  ## the main job on real Multi30k German-English
	bash experiments/demo.sh

docs: install  ## the documentation site in docs/_build/html (index.html); any warning fails the build
	$(BIN)/sphinx-build -W --keep-going -n -b html docs docs/_build/html

GUIDE_SIZE ?= full
guide: install  ## docs/guide.ipynb rebuilt from docs/guide.py and run at full size (tests run it tiny)
	$(BIN)/python docs/build_guide.py --size $(GUIDE_SIZE) --notebook docs/guide.ipynb

clean:
	rm -rf $(VENV) *.egg-info runs/demo docs/_build docs/_generated
