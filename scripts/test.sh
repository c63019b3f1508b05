#!/usr/bin/env bash
# The whole test suite: a Release build (GCC 12, what users and distributions build) with every
# test, then the whole tree with clang, ASan+UBSan and libFuzzer (warnings as errors): the fuzz
# targets run, then every test but the VM rigs and benchmarks under the sanitizers. The default
# build type (RelWithDebInfo, -O2 -g) differs from Release only in -O2 and -g.
# Needs root for the network-namespace tests (they say so and skip otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
start=$(date +%s)
# run_ctest BUILD_DIR ARGS...: ctest, and when a test fails, its failing checks (the lines the
# tests print as "FAIL..." / "not ok ...") again at the very end, where a CI excerpt still shows
# them.
run_ctest() {
  local dir=$1; shift
  if ctest --test-dir "$dir" --output-on-failure "$@"; then return 0; fi
  echo "== what failed in $dir (the failing checks from Testing/Temporary/LastTest.log):"
  awk '/^[0-9]+\/[0-9]+ Test: / {t = $3} /^(FAIL|not ok)|\[  FAILED  \]/ {print "  " t ": " $0}' \
    "$dir/Testing/Temporary/LastTest.log" | head -60 || true
  return 1
}
echo "== build (Release, GCC)"
stage=$(date +%s)
./scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
echo "== Release build took $(( $(date +%s) - stage )) s"
echo "== tests"
stage=$(date +%s)
# Not label matrix (the same VM rig again on another stack: by hand, README.md).
run_ctest build -j 1 --timeout 600 -LE matrix
echo "== tests took $(( $(date +%s) - stage )) s"
echo "== build (clang: ASan+UBSan, libFuzzer coverage), the whole tree exactly as README.md says"
stage=$(date +%s)
# One sanitizer build serves both the fuzzers and the sanitizer test set: clang with ASan and UBSan
# (every UBSan finding stops the program) and libFuzzer's coverage instrumentation, -O2 -g. It
# replaced a separate GCC ASan+UBSan Debug build (~10 minutes of CI), and clang's UBSan sees what
# GCC's does not (a reference bound to a packed epoll_event member). GCC's warnings stay checked
# in the Release build above.
# Each fuzz target runs 8 s here (CI's hour); the default is 20 s, longer runs by hand (README).
CC=clang CXX=clang++ ./scripts/build.sh build-fuzz -DVRDMA_FUZZ=ON -DVRDMA_FUZZ_SECONDS=8
echo "== clang build took $(( $(date +%s) - stage )) s"
echo "== fuzzers (libFuzzer, bounded time)"
stage=$(date +%s)
# A fuzz target is one single-threaded process bounded in time: two at once on the two cores.
run_ctest build-fuzz -j 2 -L fuzz
echo "== fuzzers took $(( $(date +%s) - stage )) s"
echo "== tests under ASan+UBSan"
stage=$(date +%s)
# Not the benchmarks, not the long VM migration runs (label vm), and not the reference-peer rigs
# (label peer: rxe and siw in a TCG guest, 5 minutes under ASan, whose guest NIC once stalled
# for minutes there): their minutes are TCG's, and the host code they drive runs under the
# sanitizers in the netns engine and CM tests, the migration and vhost tests, and the real-QEMU
# vhost and pv guest tests that stay in this stage.
# The hostile-frontend soak runs 60 s in the Release build and 30 s here (VRDMA_SOAK_SECONDS).
# The guest kernel driver's VM test (label kmod) runs in the Release stage only.
VRDMA_SOAK_SECONDS=30 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-fuzz -j 1 --timeout 900 -LE 'bench|vm|peer|kmod|fuzz'
echo "== tests under ASan+UBSan took $(( $(date +%s) - stage )) s"
echo "== whole suite done in $(( $(date +%s) - start )) s"
