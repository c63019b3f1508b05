#!/usr/bin/env bash
# Installs every Debian 12 package vrdma needs to build, test and run its demo (idempotent).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libboost-test-dev libibverbs-dev librdmacm-dev ibverbs-providers
      libnl-3-dev libnl-route-3-dev libsqlite3-dev zlib1g-dev libisal-dev libcap-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev
      iproute2 ethtool nftables tshark python3 python3-scapy iperf3 gnuplot-nox help2man man-db libvirt-clients libvirt-daemon-system libvirt-dev
      qemu-system-x86 busybox-static kmod cpio
      perftest ibverbs-utils rdmacm-utils nvme-cli strace linux-headers-amd64 debootstrap dkms ucx-utils)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections || true
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
