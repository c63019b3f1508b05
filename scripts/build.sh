#!/usr/bin/env bash
# scripts/build.sh [DIR] [cmake args...]: configure (once) and build into DIR (default build/).
# BUILD_TARGET=name builds only that target (e.g. fuzzers).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
fi
cmake --build "$dir" -j "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
