#!/usr/bin/env bash
# Creates .venv with the project and its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv and installing sira-pipeline with its dependencies (the first time: 1-2 minutes)..." >&2
  "$python" -m venv .venv
else
  echo "checking .venv is up to date..." >&2
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
