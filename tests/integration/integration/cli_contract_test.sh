#!/usr/bin/env bash
# The command-line contract of every tool (common/include/vrdma/common/cli.hpp, issue 27):
# --help on stdout with exit 0 and nothing on stderr, --version as "<tool> <version>", and every
# wrong invocation of the table below exits 2 (usage) or 1 (it could not be done) with ONE line on
# stderr that says what was wrong and what to do, and nothing on stdout.
# Usage: cli_contract_test.sh VERSION VRDMACTL VRDMAD VRDMA-PERF PVVERBS-BIND VRDMA-STREAM VRDMA-MEMCMP
set -uo pipefail
VERSION=$1
V=$2
VRDMAD=$3
shift
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0 checks=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
run() { "$@" </dev/null >"$W/out" 2>"$W/err"; echo $? >"$W/rc"; }
rc() { cat "$W/rc"; }

# Every tool: --help, --version, an unknown option.
for tool in "$@"; do
  name=$(basename "$tool")
  run "$tool" --help
  checks=$((checks + 1))
  [ "$(rc)" = 0 ] && [ -s "$W/out" ] && [ ! -s "$W/err" ] && grep -q -- '--version' "$W/out" ||
    fail "$name --help: exit $(rc), $(wc -l <"$W/out") lines on stdout, stderr: $(head -c 200 "$W/err")"
  run "$tool" --version
  checks=$((checks + 1))
  [ "$(rc)" = 0 ] && [ "$(cat "$W/out")" = "$name $VERSION" ] && [ ! -s "$W/err" ] ||
    fail "$name --version: exit $(rc), stdout '$(head -c 100 "$W/out")'"
done

# usage STATUS PHRASE ARGS...: vrdmactl ARGS exits STATUS with one line on stderr holding PHRASE.
usage() {
  local want=$1 phrase=$2
  shift 2
  run "$V" "$@"
  checks=$((checks + 1))
  if [ "$(rc)" != "$want" ] || [ -s "$W/out" ] || [ "$(wc -l <"$W/err")" != 1 ] || ! grep -qF -- "$phrase" "$W/err"; then
    fail "vrdmactl $*: exit $(rc) (want $want), stdout $(wc -c <"$W/out") bytes, stderr: $(cat "$W/err")"
  fi
}
# Every vrdmactl command has its help on stdout.
for cmd in "domain" "domain attach" "domain detach" "migrate" "device" "device status" "device migrate" \
  "migration-vf" "migration-vf up" "migration-vf show" "migration-vf release" "vf" "vf list" "vf assign" "hook" "list"; do
  # shellcheck disable=SC2086
  run "$V" $cmd --help
  checks=$((checks + 1))
  [ "$(rc)" = 0 ] && [ -s "$W/out" ] && [ ! -s "$W/err" ] || fail "vrdmactl $cmd --help: exit $(rc), stderr: $(cat "$W/err")"
done

S=/run/vrdma-cli-test.sock
usage 2 "A subcommand is required (run 'vrdmactl --help'" 
usage 2 "vrdmactl: A subcommand is required" bogus
usage 2 "vrdmactl domain: A subcommand is required" domain
usage 2 "'bogus:foo' is not an engine: an engine is soft:" domain attach --socket $S --engine bogus:foo
usage 2 "the engine 'soft:10.0.0' does not name an IPv4 address" domain attach --socket $S --engine soft:10.0.0
usage 2 "the engine 'verbs:' names no device" domain attach --socket $S --engine verbs:
usage 2 "the engine option 'mtu' is not key=value" domain attach --socket $S --engine "soft:10.0.0.5?mtu"
usage 2 "'zz' is not a usable MAC address" domain attach --socket $S --engine soft:10.0.0.5 --mac zz
usage 2 "--queue-size: must be a power of two in 16..1024, not 100" domain attach --socket $S --engine soft:10.0.0.5 --queue-size 100
usage 2 "--poll-us: Value 0 not in range 1 to 1000000" domain attach --socket $S --engine soft:10.0.0.5 --poll-us 0
usage 2 "--migration-port: Value 70000 not in range 1 to 65535" domain attach --socket $S --engine soft:10.0.0.5 --migration-port 70000
usage 2 "excludes --incoming" domain attach --socket $S --engine soft:10.0.0.5 --migration-port 7000 --incoming tcp:10.0.0.1:7000
usage 2 "say which engine serves the device" domain attach --socket $S
usage 2 "--socket is required" domain attach --engine soft:10.0.0.5
usage 2 "--vf-vlan takes a VLAN id, 0..4094 (0: none), not '5000'" domain attach --socket $S --vf-vlan 5000
usage 2 "--xml excludes --live" domain attach --socket $S --engine soft:10.0.0.5 --live g --xml "$W/none.xml"
usage 2 "--connect requires --live" domain attach --socket $S --engine soft:10.0.0.5 --connect qemu:///system
usage 2 "--timeout requires --live" domain detach --timeout 5
usage 2 "--timeout: Value 0 not in range 1 to 3600" domain detach --live g --timeout 0
usage 2 "--control is required" device status
usage 2 "--to is required" device migrate --control /run/x.ctl
usage 2 "--timeout: Value 0 not in range" device migrate --control /run/x.ctl --to tcp:10.0.0.1:7000 --timeout 0
usage 2 "dest_uri is required" migrate g1
usage 2 "--parallel: Value 0 not in range" migrate g1 qemu+tcp://h/system --parallel 0
usage 2 "vrdmactl migration-vf: A subcommand is required" migration-vf
usage 2 "vrdmactl migration-vf: A subcommand is required" migration-vf sideways
usage 2 "vrdmactl vf: A subcommand is required" vf
usage 2 "--count: Value 0 not in range 1 to 65535" vf enable --pf ens1f0 --count 0
usage 2 "libvirt calls it as 'vrdmactl hook qemu DOMAIN" hook
# Could not be done: exit 1, one sentence.
usage 1 "cannot read /nonexistent/dom.xml" domain attach --socket $S --engine soft:10.0.0.5 --xml /nonexistent/dom.xml
usage 1 "connecting to vrdmad's control socket $W/none.ctl" device status --control "$W/none.ctl"
printf '<domain type="kvm"><name>g</name><memory>262144</memory><os><type>hvm</type></os><devices/></domain>\n' >"$W/dom.xml"
usage 1 "has no vrdma:device element, so there is nothing to detach" domain detach --xml "$W/dom.xml"
# attach then detach gives back the domain without the device: the disk and the metadata go.
checks=$((checks + 1))
if "$V" domain attach --socket $S --engine soft:10.0.0.5 --xml "$W/dom.xml" >"$W/with.xml" &&
   grep -q "path=\"$S\"" "$W/with.xml" && grep -q 'vrdma:device' "$W/with.xml" &&
   "$V" domain detach --xml "$W/with.xml" >"$W/without.xml"; then
  ! grep -q "path=\"$S\"" "$W/without.xml" && ! grep -q 'vrdma:device' "$W/without.xml" && grep -q '<name>g</name>' "$W/without.xml" ||
    fail "domain detach left the device: $(cat "$W/without.xml")"
else
  fail "domain attach | detach failed"
fi
# list: an empty run folder says so; --json is one object with no backends.
checks=$((checks + 1))
[ "$("$V" list --dir "$W")" = "No vrdmad backend has a control socket in $W." ] || fail "vrdmactl list on an empty folder"
checks=$((checks + 1))
[ "$("$V" list --dir "$W" --json)" = "{\"backends\":[],\"dir\":\"$W\"}" ] || fail "vrdmactl list --json on an empty folder: $("$V" list --dir "$W" --json)"
# Log lines (common/log.hpp): into a file, an ISO 8601 UTC time and the level; on the journal's
# stream (JOURNAL_STREAM names stderr), a syslog priority prefix journald files the entry under.
run "$VRDMAD" --socket "$W/x.sock" --engine soft:203.0.113.9
checks=$((checks + 1))
[ "$(rc)" = 1 ] && grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z vrdma error: vrdmad: cannot open engine soft:203.0.113.9: .*ip addr add' "$W/err" ||
  fail "vrdmad's error line in a file: exit $(rc), $(cat "$W/err")"
: >"$W/journal"
JOURNAL_STREAM=$(stat -c '%d:%i' "$W/journal") "$VRDMAD" --socket "$W/x.sock" --engine soft:203.0.113.9 2>>"$W/journal"
checks=$((checks + 1))
grep -q '^<3>error: vrdmad: cannot open engine soft:203.0.113.9' "$W/journal" || fail "vrdmad's error line on the journal's stream: $(cat "$W/journal")"
echo "$checks checks, $fails failed"
[ "$fails" = 0 ]
