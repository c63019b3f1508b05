# Sourced by the package scripts (make_dkms_deb.sh and make_provider_deb.sh here, and
# integration/packaging/make_host_deb.sh).
# pkg_setup NAME USAGE ARG...: SOURCE_DIR and OUT_DIR from the ARGs (--help prints USAGE and
# exits 0; anything but two arguments exits 2), as SRC and OUT (made); VER, the project's version
# (CMakeLists.txt); STAGE, an empty staging folder (mode 0755, as dpkg-deb wants it) removed at exit.
pkg_setup() {
  local name=$1 usage=$2
  shift 2
  [ "${1:-}" = --help ] && { echo "$usage"; exit 0; }
  [ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
  SRC=$(readlink -f "$1")
  mkdir -p "$2"
  OUT=$(readlink -f "$2")
  VER=$(sed -n 's/^project(vrdma VERSION \([0-9][0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
  [ -n "$VER" ] || { echo "$name: no project version in $SRC/CMakeLists.txt" >&2; exit 1; }
  STAGE=$(mktemp -d)
  chmod 0755 "$STAGE"
  trap 'rm -rf "$STAGE"' EXIT
}
