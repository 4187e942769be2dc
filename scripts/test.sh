#!/usr/bin/env bash
# README command 2: install, fetch the engines (cached in ~/.m2), run the whole test suite
# against real OpenSearch (1 and 3 nodes) and real Elasticsearch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/sira engine fetch --kind opensearch
.venv/bin/sira engine fetch --kind elasticsearch
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: the selection is empty or the suite is broken" >&2
  exit 1
fi
exit "$rc"
