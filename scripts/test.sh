#!/usr/bin/env bash
# The whole test suite: a normal build, an ASan+UBSan build, and the libFuzzer targets (clang).
# Needs root for the network-namespace tests (they say so and skip otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
start=$(date +%s)
echo "== build (RelWithDebInfo)"
./scripts/build.sh build
echo "== tests"
ctest --test-dir build --output-on-failure -j 1 --timeout 600
echo "== build (ASan+UBSan)"
./scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DVRDMA_SANITIZE=ON
echo "== tests under ASan+UBSan"
# Not the benchmarks, not the long VM migration runs (label vm), and not the reference-peer rigs
# (label peer: rxe and siw in a TCG guest, 5 minutes under ASan, whose guest NIC once stalled
# for minutes there): their minutes are TCG's, and the host code they drive runs under the
# sanitizers in the netns engine and CM tests, the migration and vhost tests, and the real-QEMU
# vhost and pv guest tests that stay in this stage.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j 1 --timeout 900 -LE 'bench|vm|peer'
echo "== fuzzers (clang libFuzzer, bounded time)"
CC=clang CXX=clang++ BUILD_TARGET=fuzzers ./scripts/build.sh build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVRDMA_FUZZ=ON
ctest --test-dir build-fuzz --output-on-failure -j 1 -L fuzz
echo "== whole suite done in $(( $(date +%s) - start )) s"
