#!/usr/bin/env bash
# vrdmactl hook qemu and vrdmactl device, on their own (no libvirt): the hook's decisions for
# vrdmad domains (incoming backend on migrate begin with the XML rewritten, ensure on
# prepare/start, stop on release, sentences and status 1 on failure) and the device subcommand
# against a stand-in vrdmad control socket (fake_vrdmad.py).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
V=$1
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed" >&2; exit 77; }
W=$(mktemp -d /tmp/lv9hook.XXXXXX)
cleanup() {
  local p
  for p in "$W"/*.pid; do [ -e "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# Running (a zombie counts as gone: the detached backend's new parent may never reap it).
runs() { [ -r /proc/$1/stat ] && [ "$(sed 's/.*) //' /proc/$1/stat | cut -c1)" != Z ]; }
export VRDMA_VRDMAD=$HERE/fake_vrdmad.py VRDMA_HOOK_LOG=$W/hook.log
host=$(hostname -s)

dom() {
  cat <<X
<domain type='kvm'><name>g1</name>
  <metadata><vrdma:device xmlns:vrdma='https://vrdma.dev/xmlns/1' $1/></metadata>
  <devices><interface type='vhostuser'><source type='unix' path='$W/g1.sock' mode='client'/></interface></devices>
</domain>
X
}
GOOD="socket='$W/g1.sock' engine='soft:10.0.0.5' mac='52:54:00:00:00:01' announce='eth0' incoming='tcp:10.99.9.2:7811' poll-us='200' notices='10.0.0.5'"

# Not ours: nothing printed (libvirt keeps its XML), status 0; operations we ignore: status 0.
out=$(echo "<domain><name>x</name></domain>" | "$V" hook qemu x migrate begin -) || fail "plain domain: status $?"
[ -z "$out" ] || fail "the hook printed XML for a domain without vrdma:device"
dom "$GOOD" | "$V" hook qemu g1 started begin - || fail "started begin must be a no-op"
"$V" hook qemu 2>/dev/null; [ $? = 2 ] || fail "a hook call without arguments is a usage error"

# An incomplete element: status 1 and a sentence naming the attribute.
err=$(dom "socket='$W/g1.sock' incoming='tcp:1.2.3.4:5'" | "$V" hook qemu g1 prepare begin - 2>&1 >/dev/null)
[ $? = 1 ] || fail "an element without engine must fail the hook"
echo "$err" | grep -q "vrdma hook: domain g1: .*no engine attribute" || fail "unclear message: $err"

# migrate begin: the destination backend in incoming mode, the XML with this host's socket.
xml=$(dom "$GOOD" | "$V" hook qemu g1 migrate begin -) || fail "migrate begin failed"
S=$W/g1.$host.sock
echo "$xml" | grep -q "path=\"$S\"" || fail "the printed XML does not name $S: $xml"
echo "$xml" | grep -q "control=\"$W/g1.$host.ctl\"" || fail "the printed XML has no per-host control socket"
[ -S "$S" ] || fail "the incoming backend does not serve $S"
grep -q -- "--incoming tcp:10.99.9.2:7811" "$S.args" || fail "the backend is not in incoming mode: $(cat "$S.args")"
grep -q -- "--engine soft:10.0.0.5 --control $W/g1.$host.ctl --mac 52:54:00:00:00:01 --announce eth0" "$S.args" ||
  fail "the backend's arguments are wrong: $(cat "$S.args")"
grep -q -- "--supervise" "$S.args" || fail "the incoming backend is not supervised: $(cat "$S.args")"
grep -q -- "--poll-us 200" "$S.args" || fail "the domain's poll-us did not reach vrdmad: $(cat "$S.args")"
grep -q -- "--notices 10.0.0.5" "$S.args" || fail "the domain's notices address did not reach vrdmad: $(cat "$S.args")"
grep -q -- "--domain g1" "$S.args" || fail "the domain's name did not reach vrdmad (vrdmactl list names it): $(cat "$S.args")"
pid=$(cat "$S.pid")
"$V" device status --control "$W/g1.$host.ctl" | grep -q "waits for an incoming migration" ||
  fail "vrdmactl device status does not describe the incoming phase"

# prepare/start with the rewritten XML: the same backend, not a second one.
echo "$xml" | "$V" hook qemu g1 prepare begin - || fail "prepare begin failed"
echo "$xml" | "$V" hook qemu g1 start begin - || fail "start begin failed"
[ "$(cat "$S.pid")" = "$pid" ] || fail "prepare/start started a second backend"
grep -q "g1 start begin: backend already runs" "$W/hook.log" || fail "the hook log does not say the backend runs"

# release: the backend stops, its sockets and pid file go.
echo "$xml" | "$V" hook qemu g1 release end - || fail "release end failed"
! runs $pid || fail "the backend $pid still runs after release"
[ ! -e "$S" ] && [ ! -e "$S.pid" ] && [ ! -e "$W/g1.$host.ctl" ] || fail "release left sockets or the pid file"

# prepare on a plain start (not a migration): the backend without --incoming.
dom "$GOOD" | "$V" hook qemu g1 prepare begin - || fail "prepare begin (start) failed"
! grep -q -- --incoming "$W/g1.sock.args" || fail "a plain start must not make vrdmad a migration destination"
grep -q -- "--supervise" "$W/g1.sock.args" || fail "the hook must start vrdmad supervised (--supervise): $(cat "$W/g1.sock.args")"
grep -q -- "--poll-us 200" "$W/g1.sock.args" || fail "the domain's poll-us did not reach vrdmad: $(cat "$W/g1.sock.args")"
grep -q -- "--notices 10.0.0.5" "$W/g1.sock.args" || fail "the domain's notices address did not reach vrdmad: $(cat "$W/g1.sock.args")"

# vrdmactl device migrate: phases as sentences until migrated.
C=$W/g1.ctl
out=$("$V" device migrate --control "$C" --to tcp:10.99.9.2:7811 --timeout 10 --json 2>"$W/phases") || fail "device migrate failed: $out"
echo "$out" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); sys.exit(0 if j == {"ok": True, "to": "tcp:10.99.9.2:7811", "phase": "migrated"} else 1)' ||
  fail "device migrate --json: not one result object: $out"
out=$(cat "$W/phases")
echo "$out" | grep -q "vrdmad accepted the migration to tcp:10.99.9.2:7811" || fail "no acceptance line: $out"
echo "$out" | grep -q "waits for the guest's rings to stop" || fail "the armed phase was not reported: $out"
echo "$out" | grep -q "The device was migrated" || fail "the migrated phase was not reported: $out"
"$V" device status --control "$C" | grep -q "The device was migrated" || fail "device status after migration"
# --json: vrdmad's status object as sent; migrate's one result object (phases on stderr).
"$V" device status --control "$C" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if j["migration"]["phase"] == "migrated" else 1)' ||
  fail "device status --json is not vrdmad's status object"
dom "$GOOD" | "$V" hook qemu g1 release end - || fail "release end failed"

# A backend that exits at start: status 1 and its own words.
err=$(dom "$GOOD" | FAKE_MODE=die "$V" hook qemu g1 prepare begin - 2>&1)
[ $? = 1 ] || fail "a backend that exits at start must fail the hook"
echo "$err" | grep -q "cannot start the vrdmad backend for domain g1.*no such address" || fail "unclear message: $err"
err=$(dom "$GOOD" | VRDMA_VRDMAD=/nonexistent "$V" hook qemu g1 prepare begin - 2>&1)
[ $? = 1 ] && echo "$err" | grep -q "/nonexistent is not there" || fail "a missing backend program: $err"

# device migrate: refusal, failure and timeout are status 1 with a sentence.
for m in refuse fail stuck; do
  dom "$GOOD" | FAKE_MODE=$m "$V" hook qemu g1 prepare begin - || fail "prepare ($m) failed"
  err=$("$V" device migrate --control "$C" --to tcp:10.99.9.2:7811 --timeout 2 2>&1)
  [ $? = 1 ] || fail "device migrate ($m) must fail"
  case $m in
    refuse) echo "$err" | grep -q "vrdmad refused the migration to tcp:10.99.9.2:7811: the destination refused" ;;
    fail) echo "$err" | grep -q "failed: the destination closed the connection before LOADED" ;;
    stuck) echo "$err" | grep -q "did not finish within 2 s (phase armed)" ;;
  esac || fail "unclear message for $m: $err"
  dom "$GOOD" | "$V" hook qemu g1 release end - || fail "release ($m) failed"
done
# A socket folder that is not there (a reboot emptied /run): the hook makes it.
FRESH="socket='$W/fresh/run/g1.sock' engine='soft:10.0.0.5'"
dom "$FRESH" | "$V" hook qemu g1 prepare begin - || fail "prepare with a missing socket folder failed"
[ -S "$W/fresh/run/g1.sock" ] || fail "the hook did not make the socket folder $W/fresh/run"
dom "$FRESH" | "$V" hook qemu g1 release end - || fail "release (fresh folder) failed"
# The group QEMU runs as reaches vrdmad (--socket-group: its socket root:GROUP 0660): the last
# `group = "..."` of libvirt's qemu.conf; VRDMA_QEMU_GROUP overrides it, "none" for no group.
printf 'user = "libvirt-qemu"\n#group = "commented"\ngroup = "first"\n  group   =  "kvm"  # the last one counts\n' >"$W/qemu.conf"
GRP="socket='$W/grp/g1.sock' engine='soft:10.0.0.5'"
dom "$GRP" | VRDMA_QEMU_CONF="$W/qemu.conf" "$V" hook qemu g1 prepare begin - || fail "prepare (qemu.conf group) failed"
grep -q -- "--socket-group kvm" "$W/grp/g1.sock.args" || fail "qemu.conf's group did not reach vrdmad: $(cat "$W/grp/g1.sock.args")"
dom "$GRP" | "$V" hook qemu g1 release end - || fail "release (group) failed"
dom "$GRP" | VRDMA_QEMU_CONF="$W/qemu.conf" VRDMA_QEMU_GROUP=none "$V" hook qemu g1 prepare begin - || fail "prepare (no group) failed"
! grep -q -- "--socket-group" "$W/grp/g1.sock.args" || fail "VRDMA_QEMU_GROUP=none still gave a group: $(cat "$W/grp/g1.sock.args")"
dom "$GRP" | "$V" hook qemu g1 release end - || fail "release (no group) failed"
err=$("$V" device status --control "$W/none.ctl" 2>&1)
[ $? = 1 ] && echo "$err" | grep -q "connecting to vrdmad's control socket $W/none.ctl" ||
  fail "device status on a missing socket: $err"
echo "hook and device subcommands ok"
