#!/usr/bin/env bash
# A kernel-driver guest on a verbs engine migrates (issue 31): QEMU's own live migration of the
# nested kernel-driver guest between two vrdmads on verbs:rxe0, inside the rxe reference guest
# (the nested rig of kmod_verbs_test.sh: QEMU TCG inside TCG). The nested guest's /init is
# kmod_pair_init.sh (a later cpio over kmod_guest_init.sh): Debian's ibv_rc_pingpong -c as server
# and client on vrdma0, uid 1000, ITERS (10,000) exchanges of 4 KiB, every byte checked by the
# tool. While they run, the rxe guest starts the destination QEMU (-incoming, its vrdmad with
# --incoming guest) and migrates through the source QEMU's monitor (a chardev pipe: the rxe
# guest has no python). On the NIC the two QPs are drained, stopped and re-created on rxe0 with
# their PSNs, their QPNs kept by translation (docs/migration.md "On a NIC"); both QPs are in the
# guest, so the pair carries on. Checked: the migration completed; both tools exit 0 having
# moved 2 x ITERS x 4096 bytes; the source vrdmad completed work before the move and the
# destination re-created the 2 QPs and completed the rest. Not checked here: the guest's memory
# after the move (vrdma-memcmp is not in the rxe guest).
# Not in CI (~4 min, nested TCG); label matrix: ctest --test-dir build -R vm_kmod_verbs_migrate_test
#   kmod_verbs_migrate_test.sh SOURCE_DIR VRDMAD   exits 77 (skip) without root, QEMU or the
#   guests' parts; KEEP_WORK=1 keeps the logs.
set -uo pipefail
[ "$#" = 2 ] || { echo "usage: $0 SOURCE_DIR VRDMAD" >&2; exit 2; }
SRC=$(readlink -f "$1") VRDMAD=$(readlink -f "$2")
HERE=$SRC/tests/conformance/rxe
. "$SRC/tests/conformance/serial_lib.sh"
. "$SRC/tests/conformance/vm/kmod_lib.sh"
. "$SRC/tests/conformance/vm/nested_lib.sh"  # nested_build, nested_qemu
rig_require
T0=$(date +%s)
work=$(mktemp -d)
NS=vkvm$$ HOST=10.77.0.1 GUEST=10.77.0.2 GUEST_MAC=52:54:00:77:00:02 GUEST_MEM_MB=3072
ITERS=${ITERS:-10000}
. "$HERE/peer_rig.sh"
cleanup() { rig_cleanup; if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
# The nested guest's /init: the local pair (a later cpio replaces kmod_guest_init.sh).
mkdir -p "$work/pinit"; cp "$SRC/tests/conformance/vm/kmod_pair_init.sh" "$work/pinit/init"; chmod +x "$work/pinit/init"
(cd "$work/pinit" && echo init | cpio -o -H newc --quiet | gzip -1) > "$work/pinit.cpio.gz"
nested_build "ibv_rc_pingpong" "$work/pinit.cpio.gz"
after_boot() { :; }
rig_net
guest_boot || exit 1
echo "rxe guest ready after $(($(date +%s) - T0)) s"
Q="$(nested_qemu 512) -append 'console=ttyS0 quiet panic=-1 no_timer_check vrdma.ip=$GUEST vrdma.iters=$ITERS'"
guest_start "trap '' PIPE; rm -f /tmp/k?.sock /tmp/k?.ctl; mkfifo /tmp/ma.in /tmp/ma.out;" \
 "VRDMA_LOG=info /opt/vrdma/vrdmad --socket /tmp/ka.sock --engine verbs:rxe0 --control /tmp/ka.ctl 2>/tmp/va.log & VA=\$!;" \
 "VRDMA_LOG=info /opt/vrdma/vrdmad --socket /tmp/kb.sock --engine verbs:rxe0 --control /tmp/kb.ctl --incoming guest 2>/tmp/vb.log & VB=\$!;" \
 "i=0; while { [ ! -S /tmp/ka.sock ] || [ ! -S /tmp/kb.sock ]; } && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done; T=\$(date +%s);" \
 "$Q -serial file:/tmp/pa.log -chardev socket,id=vr,path=/tmp/ka.sock,reconnect=1 -chardev pipe,id=mon,path=/tmp/ma -mon chardev=mon,mode=readline > /tmp/qa.log 2>&1 & A=\$!;" \
 "cat /tmp/ma.out > /tmp/ma.txt & exec 5>/tmp/ma.in;" \
 "i=0; while ! grep -q VRDMA-PAIR-STARTED /tmp/pa.log 2>/dev/null && [ \$i -lt 400 ] && kill -0 \$A; do sleep 1; i=\$((i+1)); done; echo pair started after \$((\$(date +%s)-T)) s;" \
 "$Q -serial file:/tmp/pb.log -chardev socket,id=vr,path=/tmp/kb.sock,reconnect=1 -incoming tcp:127.0.0.1:4444 > /tmp/qb.log 2>&1 & B=\$!; sleep 15;" \
 "S=\$(date +%s); echo 'migrate -d tcp:127.0.0.1:4444' >&5;" \
 "i=0; while [ \$i -lt 300 ]; do echo 'info migrate' >&5; sleep 2; grep -q -E 'Migration status: (completed|failed)' /tmp/ma.txt && break; i=\$((i+2)); done;" \
 "echo migrated after \$((\$(date +%s)-S)) s; grep -a -E 'Migration status|total time|downtime:' /tmp/ma.txt | tail -3;" \
 "i=0; while ! grep -q VRDMA-GUEST-DONE /tmp/pb.log 2>/dev/null && [ \$i -lt 600 ] && kill -0 \$B; do sleep 1; i=\$((i+1)); done;" \
 "kill \$A 2>/dev/null; tr -d '\\r' < /tmp/pa.log | grep -a VRDMA- | sed 's/^/A: /'; tr -d '\\r' < /tmp/pb.log | grep -a VRDMA- | sed 's/^/B: /'; cat /tmp/qa.log /tmp/qb.log;" \
 "kill \$VA \$VB; wait \$VA \$VB; echo '--- vrdmad a:'; grep -v 'vhost-user\\|vring' /tmp/va.log | tail -15; echo '--- vrdmad b:'; grep -v 'vhost-user\\|vring' /tmp/vb.log | tail -20"
guest_wait "$work/m.out" 1500 || true
echo QUIT >&3
sed 's/^/  /' "$work/m.out" | grep -v "^  ===" | cut -c1-300
passed=0 failed=0
check() {  # NAME COMMAND...
  if "${@:2}"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
bytes=$((2 * 4096 * ITERS)) f=$work/m.out
cqes() { grep "$1" "$f" | grep -o '"cqes":[0-9]*' | head -1 | cut -d: -f2; }
check "QEMU's live migration of the nested kernel-driver guest between two vrdmads on verbs:rxe0 completed" \
  grep -q "Migration status: completed" "$f"
check "ibv_rc_pingpong -c server and client (uid 1000, one vrdma0) both exit 0 having moved $bytes bytes, every byte checked, across the move" \
  bash -c "grep -q 'B: VRDMA-SERVER server-rc=0' '$f' && grep -q 'B: VRDMA-CLIENT client-rc=0' '$f' &&
    grep -q 'B: VRDMA-SERVER $bytes bytes in' '$f' && grep -q 'B: VRDMA-CLIENT $bytes bytes in' '$f'"
a=$(sed -n '/^--- vrdmad a:/,/^--- vrdmad b:/p' "$f" | grep -o '"cqes":[0-9]*' | head -1 | cut -d: -f2)
b=$(sed -n '/^--- vrdmad b:/,$p' "$f" | grep -o '"cqes":[0-9]*' | head -1 | cut -d: -f2)
check "the pair ran on both sides of the move (completions: ${a:-?} at the source, ${b:-?} at the destination) and its 2 QPs were re-created on rxe0 under their QPNs" \
  bash -c "[ '${a:-0}' -gt 0 ] && [ '${b:-0}' -gt 0 ] && grep -q '2 QPs re-created on verbs:rxe0 with their saved PSNs; 2 keep their QPN by translation' '$f' && grep -q 'the guest runs here' '$f'"
echo "a kernel-driver guest on a verbs engine migrating (nested): $passed passed, $failed failed, $(($(date +%s) - T0)) s"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
