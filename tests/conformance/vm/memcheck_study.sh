#!/usr/bin/env bash
# The migration memory study (docs/migration.md "Guest memory after a move"): many QEMU-driven
# moves of a TCG guest in each configuration, the destination's RAM compared with the source's
# after every move, each page that differs attributed to vrdmad or to QEMU (memcheck_run.sh),
# and a table of the results. Not part of CI (about 15 s per move); run by hand:
#   memcheck_study.sh BUILD_DIR [OUT.jsonl]
# Environment (each a list):
#   QEMUS       7.2 10            (10: QEMU 10 from the Debian 13 tree, tests/conformance/debian13.sh)
#   DEVICES     vrdma virtio-blk  (virtio-blk: QEMU's own device on a shared disk, no vrdma process)
#   BANDWIDTHS  32 0              (MiB/s; 0: no limit)
#   MOVES       20                moves per configuration
#   RUN_MOVES   10                moves per guest boot
#   STUDY_SECONDS 7200            stops starting runs after this long
# A run whose guest died or stalled keeps its work folder (named in its log); the others do not.
set -uo pipefail
B=$(readlink -f "${1:?usage: memcheck_study.sh BUILD_DIR [OUT.jsonl]}")
OUT=$(readlink -f "${2:-memcheck-$(date +%Y%m%d-%H%M%S).jsonl}")
HERE=$(cd "$(dirname "$0")" && pwd)
# The study runs for an hour or more: it runs from a copy of the rig's scripts, so that the
# tree can change meanwhile.
if [ -z "${MEMCHECK_SNAPSHOT:-}" ]; then
  snap=$(mktemp -d /tmp/memcheck-scripts.XXXXXX)
  cp -r "$HERE/.." "$snap/conformance"
  MEMCHECK_SNAPSHOT=$snap exec bash "$snap/conformance/vm/memcheck_study.sh" "$B" "$OUT"
fi
touch "$OUT"
QEMUS=${QEMUS:-7.2 10} DEVICES=${DEVICES:-vrdma virtio-blk} BANDWIDTHS=${BANDWIDTHS:-32 0}
MOVES=${MOVES:-20} RUN_MOVES=${RUN_MOVES:-10} STUDY_SECONDS=${STUDY_SECONDS:-7200}
ARGS=("$B/nicdrv/vrdma-perf" "$B/daemon/vrdmad" "$B/guest/pvverbs-bind" "$B/tests/tools/vrdma-stream" "$B/tests/tools/vrdma-memcmp")
start=$SECONDS
echo "memcheck study: results in $OUT"
for q in $QEMUS; do
  if [ "$q" = 10 ]; then
    qemu=$("$HERE/../debian13.sh" qemu) || { echo "QEMU 10 unavailable: skipped"; continue; }
  else
    qemu=qemu-system-x86_64
  fi
  for d in $DEVICES; do
    for bw in $BANDWIDTHS; do
      made=0 runs=0
      while ((made < MOVES && SECONDS - start < STUDY_SECONDS && runs < MOVES)); do
        n=$((MOVES - made < RUN_MOVES ? MOVES - made : RUN_MOVES))
        before=$(wc -l < "$OUT")
        log=$OUT.run-$q-$d-$bw-$runs.log
        KEEP_WORK=1 QEMU=$qemu DEVICE=$d BANDWIDTH=$bw MOVES=$n MEMCHECK_LOG=$OUT timeout 1800 "$HERE/memcheck_run.sh" \
          "${ARGS[@]}" > "$log" 2>&1
        rc=$?
        kept=$(sed -n 's/^work dir kept: //p' "$log")
        [ $rc -ne 0 ] || { [ -z "$kept" ] || rm -rf "$kept"; rm -f "$log"; }
        after=$(wc -l < "$OUT")
        moved=$(tail -n $((after - before)) "$OUT" | grep -c '"memcmp"' || true)
        made=$((made + moved)) runs=$((runs + 1))
        echo "QEMU $q, $d, ${bw} MiB/s: run $runs exited $rc after $moved moves ($made of $MOVES)"
        [ $rc -eq 0 ] || echo "  see $log and $kept"
        [ $rc -eq 0 ] || [ $rc -eq 4 ] || [ "$moved" -gt 0 ] || break
      done
    done
  done
done
python3 - "$OUT" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["qemu"], r["device"], r["bandwidth"])
    t = rows.setdefault(k, {"moves": 0, "pages": 0, "moves_differing": 0, "backend": 0, "vmm": 0, "crashes": 0, "after_stop": 0})
    if "memcmp" in r:
        m = r["memcmp"]
        t["moves"] += 1
        t["pages"] += m["differing"]
        t["backend"] += m["backend_pages"]
        t["vmm"] += m["vmm_pages"]
        t["after_stop"] += m["journal_after_stop"]
        t["moves_differing"] += 1 if m["differing"] else 0
    else:
        t["crashes"] += 1
print("| QEMU | device | MiB/s | moves | moves with pages differing | pages differing | vrdmad's | QEMU's | vrdmad writes after the stop | guest died or stalled |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(rows):
    t = rows[k]
    bw = "unlimited" if k[2] == 0 else str(k[2])
    print(f"| {k[0]} | {k[1]} | {bw} | {t['moves']} | {t['moves_differing']} | {t['pages']} | {t['backend']} | {t['vmm']} | {t['after_stop']} | {t['crashes']} |")
PY
