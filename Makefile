# `make test` sets up a fresh machine (Debian packages, Python packages) and runs the whole suite.
PY ?= python3

.PHONY: setup test serve bench-gateway

setup:
	./scripts/setup.sh

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

serve:
	$(PY) -m pip install -q . && detgate serve
