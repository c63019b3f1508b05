#!/usr/bin/env bash
# with_qemu10.sh CMD [ARGS...]: runs CMD with QEMU 10 from the Debian 13 tree (debian13.sh) as the
# rigs' QEMU: QEMU (the VM shell rigs) and VRDMA_QEMU (the C++ conformance tests) name it. Exits 77
# (skip) with the reason when the tree cannot be had.
set -euo pipefail
q=$("$(dirname "$0")/debian13.sh" qemu) || { echo "SKIP: QEMU 10 (Debian 13) is not available here"; exit 77; }
export QEMU=$q VRDMA_QEMU=$q
exec "$@"
