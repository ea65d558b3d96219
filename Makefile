# `make test` sets up a fresh machine (Debian packages, Python packages) and runs the whole suite.
# The kernel tests run in their own pytest process: they set TRITON_INTERPRET=1 for the whole
# process (triton reads it when kernels are defined), which must not slow the backend's tests.
# Both suites always run, so a failure in the first cannot hide the second's counts; each
# leaves a JUnit report and its exit code, and scripts/test_summary.py ends the run with the
# counts per suite, failing if a suite failed, left no report or ran no test.
PY ?= python3
PYTEST = $(PY) -m pytest -q -p no:cacheprovider
REPORTS = build/test-reports

.PHONY: setup test

setup:
	./scripts/setup.sh

test: setup
	@rm -rf $(REPORTS) && mkdir -p $(REPORTS)
	$(PYTEST) --junitxml=$(REPORTS)/kernels.xml tests/kernels; echo $$? > $(REPORTS)/kernels.rc
	$(PYTEST) --junitxml=$(REPORTS)/others.xml tests --ignore=tests/kernels; echo $$? > $(REPORTS)/others.rc
	@$(PY) scripts/test_summary.py $(REPORTS) kernels others
