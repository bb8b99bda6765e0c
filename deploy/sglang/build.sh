#!/usr/bin/env bash
# Installs SGLang into its own virtualenv outside the repository, once per machine, for the sidecar
# tests only: SGLang's CPU engine serving the embedded model. Not a deployment recipe.
#   sglang==0.5.23 pins torch 2.14.1 and CUDA-only packages, so its wheel goes in --no-deps beside
#   torch 2.13.0's CPU build and the dependencies it imports on a CPU.
# Two shims make it start, both test-environment only:
#   - sgl_kernel (imported unconditionally, CUDA-only on PyPI): a stub whose functions raise
#     NotImplementedError (deploy/sglang/sgl_kernel_stub.py); none is called while serving a Llama model.
#   - torchvision (PyPI's build is CUDA's; its fake-op registrations fail beside the CPU torch with
#     "operator torchvision::nms does not exist"): its _meta_registrations module is emptied.
# Usage: deploy/sglang/build.sh DEST_DIR [VERSION]   ->   DEST_DIR/bin/python -m sglang.launch_server
set -euo pipefail
dest=${1:?usage: build.sh DEST_DIR [VERSION]}
version=${2:-0.5.23}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)

start=$(date +%s)
rm -rf "$dest"
"$python" -m venv "$dest"
pip=("$dest/bin/python" -m pip install -q --disable-pip-version-check)
echo "sglang: installing sglang==$version (no deps), torch==2.13.0 (CPU) and its CPU dependencies into $dest"
"${pip[@]}" torch==2.13.0
"${pip[@]}" --no-deps "sglang==$version" "torchvision==0.28.*"
"${pip[@]}" torch==2.13.0 aiohttp "anthropic>=0.20.0" blobfile==3.0.0 build "compressed-tensors==0.18.0" datasets \
  distro easydict einops fastapi gguf interegular IPython "kernels>=0.14.1,<0.15" "llguidance>=1.7.6,<2" \
  "mistral_common>=1.11.5" modelscope msgspec ninja numba==0.65.1 numpy openai==2.8.0 openai-harmony==0.0.4 orjson \
  packaging partial_json_parser pillow "prometheus-client>=0.20.0" psutil pybase64 pydantic "python-dateutil<3" \
  python-multipart "pyzmq>=25.1.2" regex requests scipy sentencepiece==0.2.1 setproctitle soundfile==0.13.1 tiktoken \
  tokenizers==0.23.2 transformers==5.19.0 "uvicorn>=0.51" uvloop watchfiles xgrammar==0.2.7 xxhash zstandard

site=$("$dest/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$site/sgl_kernel"
cp "$here/sgl_kernel_stub.py" "$site/sgl_kernel/__init__.py"
echo '"""Emptied for the ilre sidecar tests: no torchvision ops beside the CPU torch (deploy/sglang/build.sh)."""' \
  > "$site/torchvision/_meta_registrations.py"

SGLANG_USE_CPU_ENGINE=1 "$dest/bin/python" -c "import sglang.srt.entrypoints.http_server"
"$dest/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "sglang==$version installed in $(( $(date +%s) - start )) s" | tee "$dest/build-info.txt"
