#!/usr/bin/env bash
# The whole test suite: a normal build, an ASan+UBSan build, a Release build (GCC), and the whole
# tree with clang and libFuzzer (the fuzz targets run; the rest is built, warnings as errors).
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
# The hostile-frontend soak runs 60 s in the normal build and 30 s here (VRDMA_SOAK_SECONDS).
VRDMA_SOAK_SECONDS=30 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j 1 --timeout 900 -LE 'bench|vm|peer'
echo "== build (Release, GCC): what distributions build (-O3 -DNDEBUG), warnings are errors there too"
stage=$(date +%s)
./scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release
ctest --test-dir build-release --output-on-failure -j 1 --timeout 300 -L unit
echo "== Release build and unit tests took $(( $(date +%s) - stage )) s"
echo "== fuzzers (clang libFuzzer, bounded time), the whole tree built with clang exactly as README.md says"
stage=$(date +%s)
CC=clang CXX=clang++ ./scripts/build.sh build-fuzz -DVRDMA_FUZZ=ON
ctest --test-dir build-fuzz --output-on-failure -j 1 -L fuzz
# clang's UBSan sees what GCC's does not (a reference bound to a packed epoll_event member): the
# event loop's tests and the hostile-frontend test (vrdmad under it) run under it too.
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  ctest --test-dir build-fuzz --output-on-failure -j 1 --timeout 300 \
  -R '^(vhost_event_loop_test|vhost_peer_fd_test|vhost_guest_fault_test|vrdmad_frontend_hostile_test)$'
echo "== clang build and fuzzers took $(( $(date +%s) - stage )) s"
echo "== whole suite done in $(( $(date +%s) - start )) s"
