# `make test` sets up a fresh machine (Debian packages, Python packages) and runs the whole suite.
# The kernel tests run in their own pytest process: they set TRITON_INTERPRET=1 for the whole
# process (triton reads it when kernels are defined), which must not slow the backend's tests.
PY ?= python3
PYTEST = $(PY) -m pytest -q -p no:cacheprovider

.PHONY: setup test

setup:
	./scripts/setup.sh

test: setup
	$(PYTEST) tests/kernels
	$(PYTEST) tests --ignore=tests/kernels
