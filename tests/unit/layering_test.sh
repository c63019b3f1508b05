#!/usr/bin/env bash
# The dependency rule (docs/architecture.md) as the compiler sees it: reads the build's
# compile_commands.json and fails when
#  - a test source has any module's src/ on its include path (tests use public headers or a
#    test-support library), or
#  - a module's library source (MODULE/src/...) has the include folder of a module it may not use:
#      common      <- common
#      nicdrv      <- common, nicdrv
#      sriov       <- common, sriov
#      vhost       <- common, vhost                  (the vhost-user protocol alone)
#      device      <- common, nicdrv, vhost, device  (the device model: knows no migration)
#      migration   <- common, nicdrv, vhost, device, migration
#      guest       <- common, nicdrv, vhost, guest   (the frontend and the nicdrv API)
#      integration <- common, sriov, integration
#    The device contract (include/, the C header) is open to every module. Tools (MODULE/tools/)
#    are binaries: they may link what they register (vrdma-perf the pv provider, vrdmad
#    migration), so they are not checked here.
#   layering_test.sh SOURCE_DIR COMPILE_COMMANDS_JSON
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SOURCE_DIR COMPILE_COMMANDS_JSON" >&2; exit 2; }
root=$(cd "$1" && pwd) db=$2
[ -s "$db" ] || { echo "no $db: configure with CMAKE_EXPORT_COMPILE_COMMANDS (the top CMakeLists sets it)" >&2; exit 1; }
declare -A allowed=(
  [common]="common" [nicdrv]="common nicdrv" [sriov]="common sriov" [vhost]="common vhost"
  [device]="common nicdrv vhost device" [migration]="common nicdrv vhost device migration" [guest]="common nicdrv vhost guest"
  [integration]="common sriov integration"
)
modules="${!allowed[*]}"
bad=0 tests=0 libs=0
# One compile command per line in CMake's output: "command": "... -I... -c FILE".
while IFS= read -r line; do
  file=$(grep -oE -- "-c $root/[^ \"]+" <<<"$line" | cut -c4-) || continue
  rel=${file#"$root"/}
  incs=$(grep -oE -- "-I$root/[^ \"]*" <<<"$line" | cut -c3- | sed "s|^$root/||" || true)
  case $rel in
    tests/*)
      tests=$((tests + 1))
      for inc in $incs; do
        case $inc in
          tests/*) ;;
          */src|*/src/*) echo "FAIL: $rel has $inc on its include path: tests use public headers"; bad=$((bad + 1)) ;;
        esac
      done ;;
    */src/*)
      mod=${rel%%/*}
      [ -n "${allowed[$mod]:-}" ] || continue
      libs=$((libs + 1))
      for inc in $incs; do
        top=${inc%%/*}
        [ "$top" = include ] && continue
        case " $modules " in *" $top "*) ;; *) continue ;; esac
        case " ${allowed[$mod]} " in
          *" $top "*) [ "$top" = "$mod" ] || case $inc in */src|*/src/*) echo "FAIL: $rel reaches $inc, another module's src/"; bad=$((bad + 1)) ;; esac ;;
          *) echo "FAIL: $rel ($mod) has $inc on its include path: $mod may use only ${allowed[$mod]}"; bad=$((bad + 1)) ;;
        esac
      done ;;
  esac
done < <(grep '"command"' "$db")
echo "checked $tests test sources and $libs library sources: $bad arrows against the rule"
[ "$tests" -gt 0 ] && [ "$libs" -gt 0 ] || { echo "FAIL: nothing to check in $db"; exit 1; }
[ "$bad" -eq 0 ]
