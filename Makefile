# Two commands for a new user: `make demo` and `make test`. Both create .venv when it is missing and
# install into it; the stamp files make a second run skip pip entirely.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test test-slow test-all test-ray lint docs docs-serve format clean bench gpu-check cluster cluster-stop lab lab-stop lab-cluster lab-ray lab-ray-stop

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test]'
	@touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/ddpdoctor run --nproc 2 --backend gloo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check ddpdoctor tests benchmarks sample_jobs
	$(BIN)/ruff format --check ddpdoctor tests benchmarks sample_jobs
	$(BIN)/mypy

# Bytecode caching on for the suite, whatever the shell says: with PYTHONDONTWRITEBYTECODE set,
# every pytest process rewrote and compiled all 450 test modules again (7 s of CPU each, 3.5 s
# cached) and every job's processes compiled what they import.
# `make test` is the quick tier a new user runs, within 8 minutes on two cores: the unit and TUI tests and one real
# job per verdict, launcher and command. `make test-slow` runs the rest but Ray's (the corpora of
# users' code, the frameworks, FSDP, the other lab scenarios, jobs timed or killed one by one:
# tests/integration/conftest.py says which and why); `make test-all` runs every tier.
test: lint docs
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --durations=40 -n 2 --dist loadgroup -m "not ray and not slow"

test-slow: $(VENV)/.installed-test
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --durations=10 -n 2 --dist loadgroup -m "slow and not ray"

# Every tier, as CI runs it (.ci/run): the first two in one pytest session, so that the shared
# runs both read are started once (the slow tier alone starts the first tier's again), then Ray's.
test-all: lint docs
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --durations=40 -n 2 --dist loadgroup -m "not ray"
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --durations=20 -n 2 --dist loadgroup -m ray

# The tests that start Ray clusters (marked ray: a local cluster, one started with `ray start`,
# and the lab's two hosts): each Ray job takes minutes on a 2-core machine, so they run apart.
test-ray: $(VENV)/.installed-test
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --durations=10 -n 2 --dist loadgroup -m ray

# The documentation site (mkdocs-material), built strictly: a broken link or a page missing from
# the navigation fails the build, and so `make test`.
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

docs-serve: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

format: $(VENV)/.installed-test
	$(BIN)/ruff check --fix ddpdoctor tests benchmarks sample_jobs
	$(BIN)/ruff format ddpdoctor tests benchmarks sample_jobs

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/doctor.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/runtime_hotpath.py
	$(BIN)/python benchmarks/runtime_own.py
	$(BIN)/python benchmarks/detect.py
	$(BIN)/python benchmarks/false_alarms.py
	$(BIN)/python benchmarks/monitor_scale.py
	$(BIN)/python benchmarks/merge_scale.py
	$(BIN)/python benchmarks/tui.py

# ddpdoctor's NCCL path on a machine with an NVIDIA GPU, in one command and under seven minutes: the
# tests marked gpu, the doctor, the reference job on NCCL healthy and hanging, the step-time ratio;
# build/gpu-check/summary.{json,txt}. Without a GPU it says so and exits 0. It runs under .venv's
# Python when there is one, else python3: a GPU machine whose python3 holds torch needs no install.
gpu-check:
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) scripts/gpu_check.py

# A one-host Slurm (Debian's slurm-wlm and munge; needs root) for the tests marked `slurm`, which
# are skipped, with the reason, while no Slurm node is idle. Idempotent.
cluster:
	bash scripts/cluster.sh start

cluster-stop:
	bash scripts/cluster.sh stop

# A multi-host lab from network namespaces (hosts h1..hN, default 2; needs root) for the tests
# marked `lab`, skipped with the reason while it is down. Idempotent. See docs/lab.md.
lab:
	bash scripts/lab.sh up $(LAB_HOSTS)

lab-stop:
	bash scripts/lab.sh down

# A Slurm of the lab's own, one slurmd per lab host (after `make cluster` installed Slurm and munge).
lab-cluster: lab
	bash scripts/lab.sh slurm

# A Ray cluster on the lab: head on h1, a node on every other host (RAY_ADDRESS=198.18.0.11:6390).
# Idempotent; the tests marked `lab` that need it start it and stop it themselves.
lab-ray: lab
	RAY=$${RAY:-$(BIN)/ray} bash scripts/lab.sh ray

lab-ray-stop:
	RAY=$${RAY:-$(BIN)/ray} bash scripts/lab.sh ray-stop

clean:
	rm -rf $(VENV) build *.egg-info ddpdoctor-runs .pytest_cache .mypy_cache
