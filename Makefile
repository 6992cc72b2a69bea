# shoal: the two commands a new user needs are `make demo` and `make test`.
# Every target installs what it needs first.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# shoal_testbed (the real control plane for tests) lives under hack/.
export PYTHONPATH := $(CURDIR)/hack

# Time budgets per test tier: whole tier (seconds) and per test (pytest-timeout).
UNIT_BUDGET ?= 300
UNIT_TEST_TIMEOUT ?= 30
INTEGRATION_BUDGET ?= 900
INTEGRATION_TEST_TIMEOUT ?= 120
E2E_BUDGET ?= 2400
E2E_TEST_TIMEOUT ?= 300

.PHONY: install lint unit integration test testbed testbed-up testbed-down e2e demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: install
	$(BIN)/ruff check operator hack tests
	$(BIN)/ruff format --check operator hack tests
	$(BIN)/mypy

unit: install
	timeout $(UNIT_BUDGET) $(BIN)/pytest tests/unit -o timeout=$(UNIT_TEST_TIMEOUT)

integration: install
	timeout $(INTEGRATION_BUDGET) $(BIN)/pytest tests/integration -o timeout=$(INTEGRATION_TEST_TIMEOUT)

# Build the control plane from Go modules (cached in ~/.cache/shoal, keyed by the pins).
testbed:
	bash hack/testbed/build.sh

testbed-up: testbed install
	$(BIN)/python -m shoal_testbed up

testbed-down: install
	$(BIN)/python -m shoal_testbed down

e2e: testbed install
	timeout $(E2E_BUDGET) $(BIN)/pytest tests/e2e -o timeout=$(E2E_TEST_TIMEOUT)

# Everything CI runs.
test: lint unit integration e2e

demo: testbed install
	bash hack/demo.sh

clean: testbed-down
	rm -rf $(VENV) .testbed .pytest_cache .mypy_cache .ruff_cache
