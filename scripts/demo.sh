#!/usr/bin/env bash
# README command 1: install, start a local OpenSearch, index the sample collection, search it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/sira demo "$@"
