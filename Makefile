# The two commands: `make demo` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime

.PHONY: demo test test-all check-clients check-wheel check-dist bench bench-quick lint clean

# `make demo` installs the runtime only; `make test` (and the checks) add the test extra.
$(RUNTIME): pyproject.toml loopwarden/__init__.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): pyproject.toml loopwarden/__init__.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP) $(RUNTIME)

demo: $(RUNTIME)
	$(BIN)/loopwarden demo

# Two pytest workers (pytest-xdist; at most four): much of the suite waits on processes,
# sockets and fsync, so two workers on two cores take about two thirds of one's time. Work
# stealing keeps both busy to the end (the long real-process tests would otherwise queue on one).
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --numprocesses=auto --maxprocesses=4 --dist worksteal

test-all: $(STAMP)  # the long reliability variants too (see docs/reliability.md)
	$(BIN)/python -m pytest -q

check-clients: $(STAMP)  # the client set-ups of the README and docs/clients.md, against real client CLIs from npm
	$(BIN)/python .ci/check_clients.py
	$(BIN)/python .ci/check_oauth_client.py  # Claude Code against an OAuth-protected server

check-wheel: $(STAMP)  # a wheel built from a clean clone installs in a fresh venv and runs the demo
	$(BIN)/python .ci/check_wheel.py

check-dist: $(STAMP)  # a wheel and an sdist of the committed tree that `twine check` accepts
	$(BIN)/python .ci/check_dist.py

bench: $(STAMP)
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
