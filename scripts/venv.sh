#!/usr/bin/env bash
# Makes the virtualenv every make target runs in ($VENV, default .venv). Debian's python3
# refuses `pip install` outside one (externally managed) and ships venv's pip bootstrap in a
# package of its own, installed here when missing. --system-site-packages: packages the
# machine already has (CI's torch and test extras) are reused, not downloaded again.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] && exit 0
if ! $PYTHON -c 'import ensurepip, venv' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends python3-venv
fi
$PYTHON -m venv --system-site-packages "$VENV"
