# One-line targets; CI runs the same ones. `make demo` and `make test` install first when needed.
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast test-unit test-logic test-sim test-sshd test-slurm test-wheel test-browser check dist \
	bench clean

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

# The tiers: tests/unit, logic and sim need nothing but Python; sshd, slurm, wheel and browser need real daemons or
# tools (docs/contributing.md). `make test-unit` ... `make test-browser` run one tier.
test-fast: install
	$(BIN)/pytest tests/unit tests/logic tests/sim

TIERS := unit logic sim sshd slurm wheel browser
$(addprefix test-,$(TIERS)): test-%: install
	$(BIN)/pytest tests/$*

# The sdist and the wheel in dist/, built as pip builds them (an isolated build environment).
dist: install
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# docs/cli.md is generated from the typer app: check fails when it differs (regenerate: see the script's docstring).
check: install
	$(BIN)/ruff check fleet tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/python tools/cli_reference.py --check docs/cli.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info dist build

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

$(BENCH_VENV)/.installed:
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet ansible-core py-spy
	touch $@
