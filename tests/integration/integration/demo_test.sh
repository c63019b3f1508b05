#!/usr/bin/env bash
# README's first command, scripts/demo.sh, on this build: it must end with every message checked
# (it exits non-zero otherwise), the guest's memory compared after each move (the demo fails when
# it differs), two moves with libvirt's downtime figures, and a PNG plot.
# Usage: demo_test.sh BUILD_DIR
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../../.." && pwd)
B=$(readlink -f "$1")
[ "$(id -u)" -eq 0 ] || { echo "demo_test: SKIP: needs root" >&2; exit 77; }
for t in libvirtd virsh qemu-system-x86_64 gnuplot; do
  command -v $t >/dev/null || { echo "demo_test: SKIP: $t is not installed (scripts/setup.sh)" >&2; exit 77; }
done
rm -f "$B/demo/demo.json" "$B/demo/migration.png"
VRDMA_BUILD=$B "$SRC/scripts/demo.sh" || { echo "FAIL: scripts/demo.sh exited $?"; exit 1; }
python3 - "$B/demo/demo.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
moves = d["moves"]
assert d["ok"] is True, "demo.json does not say ok"
assert [m["move"] for m in moves] == ["a -> b", "b -> a"], f"the moves are {moves}"
for m in moves:
    assert isinstance(m["downtime_ms"], int) and 0 < m["downtime_ms"] < m["wall_ms"], f"figures of {m}"
g, p = d["guest"], d["peer"]
assert g["messages"] == p["messages"] == g["received"] == p["received"] > 4000, f"guest {g} peer {p}"
print(f"demo_test: ok: {p['messages']} messages each way checked, downtimes {[m['downtime_ms'] for m in moves]} ms")
PY
head -c 8 "$B/demo/migration.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: no PNG plot at $B/demo/migration.png"; exit 1; }
echo "demo_test: the plot is $B/demo/migration.png ($(stat -c %s "$B/demo/migration.png") bytes)"
