#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine: a real redis-server and
# prometheus (the cache and dashboard tests run against real servers), npm and faketime (the
# agent tests), then, in the virtualenv $VENV (scripts/venv.sh), CPU torch for the backend
# and kernel tests and the package itself with its extras.
set -euo pipefail
VENV=${VENV:-.venv}
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v prometheus >/dev/null || need+=(prometheus)
# The agent tests: npm installs the real Claude Code and Codex CLIs; faketime moves Claude Code a day.
command -v npm >/dev/null || need+=(nodejs npm)
command -v faketime >/dev/null || need+=(faketime)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
VENV=$VENV "$(dirname "$0")/venv.sh"
PY=$VENV/bin/python
# torch 2.13.0 resolves to the local CPU build on this machine kind; without it pip would pull CUDA wheels.
$PY -c 'import torch' 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[backend,test]'
