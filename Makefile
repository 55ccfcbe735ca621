# One-line targets; CI runs the same ones. `make demo` and `make test` install first when needed.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast check bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/fleet demo

test: install
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m 'not sshd'

check: install
	$(BIN)/ruff check fleet tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

bench: install
	$(BIN)/python benchmarks/scale.py --nodes 16 --rounds 3
