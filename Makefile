# aegis-stream: `make demo` runs the embedded demo, `make test` the whole suite.
# Both install what they need first: a venv with the Python packages, the Kafka jars
# (Maven Central) and redis-server (apt) for the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: system-deps demo test unit integration e2e lint typecheck install services ccl_hooks bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/aegis demo

system-deps:
	scripts/system-deps

services: $(STAMP) system-deps
	$(BIN)/python scripts/services fetch

ccl_hooks: system-deps
	$(MAKE) -C ccl_hooks

test: $(STAMP) services ccl_hooks
	$(BIN)/python -m pytest -p no:cacheprovider tests

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP) services
	$(BIN)/python -m pytest -q tests/integration

e2e: $(STAMP) services
	$(BIN)/python -m pytest -q tests/e2e

lint: $(STAMP)
	$(BIN)/ruff check schemas producers processors sinks ccl_hooks tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	for b in bench/[!_]*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .cache ccl_hooks/build
