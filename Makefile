# The commands of README.md. Each installs what it needs into .venv/ (git-ignored) first.
#   make install only that install: dpkeras from this checkout (editable) with its dev extras
#   make bench   the benchmark on the devices found (simulated CPU devices when there is no GPU)
#   make test    the test suite
#   make gpu-check   where there are GPUs: the tests that need them and the benchmark on them
#   make wheel-test  build the sdist and wheel, install the wheel in a fresh venv, smoke-test it
#   make matrix  the wheel beside each supported TensorFlow and Keras pair, a subset of the tests
#                (noxfile.py; ARGS="-s 'matrix(tf2.16-keras3.8)'" for one pair)
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: install test wheel-test matrix bench lint format clean mutants keras-suite gpu-check

$(STAMP): pyproject.toml dpkeras/_version.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n auto --dist loadfile -q

wheel-test: $(STAMP)
	PYTHON=$(PYTHON) .ci/wheel-test

# One nox session per supported TensorFlow and Keras pair, each in its own venv under .nox/
# (noxfile.py): the pair, then the built wheel installed with pip, then tests/matrix.txt's tests.
matrix: $(STAMP)
	$(VENV)/bin/nox -f noxfile.py $(ARGS)

# Breaks dpkeras on purpose in named ways (tests/mutations.py) and expects the guarding tests
# to fail; slow (a cluster per cluster mutant), not part of `make test`.
mutants: $(STAMP)
	$(VENV)/bin/python -m tests.mutations $(ARGS)

# Keras's own unit tests (from the installed wheel) without a strategy, under dpkeras (every
# variable on the parameter device, and placement.hybrid()) and under MirroredStrategy, compared
# test by test (tests/keras_suite.py); every difference must be pinned, per arm, in
# tests/keras_suite_differences.py. Slow, not part of `make test` (which runs a subset, both
# arms); report in results/keras-suite/. keras-rs 0.4.0 ships no tests (wheel nor sdist):
# ARGS="--keras-rs-source DIR" with a checkout of its v0.4.0 tag adds them.
keras-suite: $(STAMP)
	$(VENV)/bin/python -m tests.keras_suite --deps --concurrent $(ARGS)

bench: $(STAMP)
	$(VENV)/bin/python -m benchmarks.compare $(ARGS)

# On a machine with GPUs: the tests that skip without them and the benchmark on the GPUs (one GPU
# is split into 2 logical GPUs), one results file, results/gpu-check/gpu-check.json; within 8
# minutes on one GPU. Without GPUs it says so and exits 0 (benchmarks/gpu_check.py).
gpu-check: $(STAMP)
	$(VENV)/bin/python -m benchmarks.gpu_check $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check dpkeras tests benchmarks noxfile.py
	$(VENV)/bin/ruff format --check dpkeras tests benchmarks noxfile.py

format: $(STAMP)
	$(VENV)/bin/ruff format dpkeras tests benchmarks noxfile.py

clean:
	rm -rf $(VENV) results build dist *.egg-info
