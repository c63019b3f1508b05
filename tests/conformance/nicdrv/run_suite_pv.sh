#!/usr/bin/env bash
# The provider conformance suite over `pv`: two vrdmad processes (one guest device each) on soft
# engines on loopback, the suite as the libpvverbs application of both.
#   run_suite_pv.sh VRDMAD PROVIDER_SUITE [suite args...]
# VRDMAD_ARGS: more vrdmad options (the polling run: --poll-us 200).
# PV_DOORBELLS=ring: libpvverbs rings through a doorbell ring of its own (the way processes do
# under the guest kernel driver) instead of the doorbell queue; both vrdmads must then have
# taken records from rings and refused no doorbell.
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
opts=ram_mib=128${PV_DOORBELLS:+&doorbells=$PV_DOORBELLS}
VRDMA_SUITE_DEVICES="pv:$TMP/a.sock?$opts,pv:$TMP/b.sock?$opts" "$SUITE" "$@" || rc=$?
if [ $rc -eq 0 ] && [ "${PV_DOORBELLS:-}" = ring ]; then
  for side in a b; do
    python3 - "$TMP/$side.ctl" "$side" <<'PY' || rc=1
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"cmd":"status"}\n')
line = s.makefile().readline()
st = json.loads(line)
rung, errors = st.get("ring_doorbells", 0), st.get("doorbell_errors", -1)
print(f"vrdmad {sys.argv[2]}: {st.get('doorbells')} doorbells, {rung} from doorbell rings, {errors} refused")
sys.exit(0 if rung > 0 and errors == 0 else 1)
PY
  done
fi
if [ $rc -ne 0 ]; then
  for side in a b; do echo "--- vrdmad $side log (last 40 lines) ---"; tail -40 "$TMP/$side.log"; done
fi
exit $rc
