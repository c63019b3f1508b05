#!/usr/bin/env bash
# Starts a vrdmad on a loopback address and runs the libpvverbs C application against it.
#   run_pvverbs_c_test.sh VRDMAD PVVERBS_C_TEST
set -euo pipefail
VRDMAD=$1 APP=$2
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
"$VRDMAD" --socket "$TMP/pv.sock" --engine "soft:127.0.0.9?port=47931" --control "$TMP/pv.ctl" 2>"$TMP/vrdmad.log" &
for _ in $(seq 100); do [ -S "$TMP/pv.ctl" ] && break; sleep 0.05; done
if ! timeout 60 "$APP" "$TMP/pv.sock?ram_mib=32"; then
  echo "--- vrdmad log ---"; cat "$TMP/vrdmad.log"; exit 1
fi
