# One-line targets; CI runs the same ones. `make demo` and `make test` install first when needed.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The tested set: every version `make install`, the wheel test and `make bench` install, transitive ones, pip and
# the build backend included. pyproject.toml holds the ranges; `make lock` writes this file from them.
LOCK   := requirements/lock.txt

.PHONY: install demo test test-fast test-unit test-logic test-sim test-sshd test-slurm test-wheel test-browser check dist \
	bench clean lock test-latest

install: $(STAMP)

# pip and setuptools first, at the locked versions, then fleet built by that setuptools (no isolated build
# environment, which would take the newest one) with its dev extra at the locked versions.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) pip setuptools
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) --no-build-isolation -e '.[dev]'
	touch $(STAMP)

# Re-lock: the newest versions pyproject.toml's ranges allow, for this Python, written to $(LOCK). Review the
# diff, run `make test`, commit the lock with what it needed.
lock: install
	$(BIN)/pip-compile --quiet --upgrade --extra dev --extra bench --all-build-deps --allow-unsafe --strip-extras \
		--no-emit-index-url --no-emit-find-links --no-emit-trusted-host --output-file $(LOCK) pyproject.toml

# The newest set pyproject.toml allows, tried on purpose: a fresh venv from the ranges alone (no lock), the fast
# tiers run in it. Run it before `make lock`, and when a dependency has a release: it finds the next deprecation
# or removal before a newcomer does. It says which versions differ from the lock first.
LATEST_VENV ?= .venv-latest
test-latest: install
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools
	$(LATEST_VENV)/bin/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python tools/lockfile.py drift $(LOCK) $(LATEST_VENV)/bin/python
	$(LATEST_VENV)/bin/pytest -p no:cacheprovider $(PARALLEL) tests/unit tests/logic tests/sim

demo: install
	$(BIN)/fleet demo

# pytest-xdist workers: most of a test's time is spent waiting on processes, daemons and bounds, so more workers
# than cores pays (docs/contributing.md has the figures); tests that share something machine-wide stay in one
# worker (tests/conftest.py). WORKERS=0 runs every test in pytest's own process, one after another.
WORKERS  ?= 4
PARALLEL := -n $(WORKERS) --dist loadgroup

test: install
	$(BIN)/pytest $(PARALLEL)

# The tiers: tests/unit, logic and sim need nothing but Python; sshd, slurm, wheel and browser need real daemons or
# tools (docs/contributing.md). `make test-unit` ... `make test-browser` run one tier.
test-fast: install
	$(BIN)/pytest $(PARALLEL) tests/unit tests/logic tests/sim

TIERS := logic sim sshd slurm wheel browser
$(addprefix test-,$(TIERS)): test-%: install
	$(BIN)/pytest $(PARALLEL) tests/$*

# Pure CPU, milliseconds a test: one process beats the workers' start-up on two cores.
test-unit: install
	$(BIN)/pytest tests/unit

# The sdist and the wheel in dist/, built as pip builds them (an isolated build environment).
dist: install
	rm -rf dist
	PIP_CONSTRAINT=$(abspath $(LOCK)) $(BIN)/python -m build --outdir dist .

# docs/cli.md is generated from the typer app: check fails when it differs (regenerate: see the script's docstring).
# tools/project_words.py fails on a remark about how the work was organised (rounds, issue numbers no reader can
# open, who else loaded the machine) in any tracked file: the repository speaks of fleet, not of its making.
check: install
	$(BIN)/ruff check fleet tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/python tools/cli_reference.py --check docs/cli.md
	$(BIN)/python tools/project_words.py

clean:
	rm -rf $(VENV) $(LATEST_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info dist build

# `make bench`: benchmarks/scale.py (1 vs 16 in-process simulated nodes); benchmarks/controller.py (fleet's own CPU,
# memory and output a host at 1,000, 5,000 and 10,000 hosts, no SSH); benchmarks/slurm.py (`--slurm` over SSH
# vs `--via srun` on 4, 8 and 16 simulated nodes under a real Slurm: the controller's wall time and CPU; as root,
# with Debian's slurmctld slurmd slurm-client munge); then benchmarks/fanout.py: fleet
# against a raw asyncssh floor, pdsh and Ansible behind the real OpenSSH sshd, and a py-spy profile of fleet;
# then benchmarks/percommand.py: the client CPU of a connection and of a command (the cost model's terms);
# then benchmarks/connectstorm.py: 2,000 and 5,000 hosts at once through fleet's connect path over real sshd, at
# fleet's default bounds (exit 1 when a host was unreachable: the target is 0).
# fanout.py at 64, 256 and 512 hosts, 3 repetitions (about an hour on 2 cores); BENCH_SIZES=16,64 for a quick look.
BENCH_VENV  ?= benchmarks/.bench-venv
BENCH_SIZES ?= 64,256,512
BENCH_REPS  ?= 3
STORM_SIZES ?= 2000,5000

bench: install $(BENCH_VENV)/.installed
	$(BIN)/python benchmarks/scale.py --nodes 16 --rounds 3
	$(BIN)/python benchmarks/controller.py --sizes 1000,5000,10000
	$(BIN)/python benchmarks/slurm.py --sizes 4,8,16 --reps 3
	$(BIN)/python benchmarks/fanout.py --sizes $(BENCH_SIZES) --reps $(BENCH_REPS) --bench-venv $(BENCH_VENV) --profile
	$(BIN)/python benchmarks/percommand.py --hosts 64 --rounds 3
	$(BIN)/python benchmarks/connectstorm.py --sizes $(STORM_SIZES)

# The bench extra's tools (ansible-core, py-spy) alone, at the locked versions; not fleet.
$(BENCH_VENV)/.installed: pyproject.toml $(LOCK) | install
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BIN)/python tools/lockfile.py extra bench > $(BENCH_VENV)/bench.txt
	$(BENCH_VENV)/bin/python -m pip install --quiet --constraint $(LOCK) --requirement $(BENCH_VENV)/bench.txt
	touch $@
