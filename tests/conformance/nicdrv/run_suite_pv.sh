#!/usr/bin/env bash
# The provider conformance suite over `pv`: two vrdmad processes (one guest device each) on soft
# engines on loopback, the suite as the libpvverbs application of both.
#   run_suite_pv.sh VRDMAD PROVIDER_SUITE [suite args...]
# VRDMAD_ARGS: more vrdmad options (the polling run: --poll-us 200).
set -euo pipefail
VRDMAD=$1 SUITE=$2; shift 2
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
for side in a b; do
  ip=127.0.0.$([ $side = a ] && echo 31 || echo 32)
  # shellcheck disable=SC2086
  "$VRDMAD" --socket "$TMP/$side.sock" --engine "soft:$ip?port=47951" --control "$TMP/$side.ctl" ${VRDMAD_ARGS:-} \
    2>"$TMP/$side.log" &
done
for _ in $(seq 100); do [ -S "$TMP/a.ctl" ] && [ -S "$TMP/b.ctl" ] && break; sleep 0.05; done
rc=0
VRDMA_SUITE_DEVICES="pv:$TMP/a.sock?ram_mib=128,pv:$TMP/b.sock?ram_mib=128" "$SUITE" "$@" || rc=$?
if [ $rc -ne 0 ]; then
  for side in a b; do echo "--- vrdmad $side log (last 40 lines) ---"; tail -40 "$TMP/$side.log"; done
fi
exit $rc
