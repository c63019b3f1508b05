# The nested rig shared by kmod_verbs_test.sh and kmod_verbs_migrate_test.sh (sourced): the
# kernel-driver guest runs nested in the rxe reference guest, QEMU TCG inside QEMU TCG, with
# vrdmad on verbs:rxe0 serving its device. Needs serial_lib.sh and kmod_lib.sh sourced, and SRC,
# VRDMAD, work and T0 set.

# nested_build "TOOL..." [CPIO]: the rxe guest (make_guest.sh) and kmod_lib.sh's kernel-driver
# guest with TOOLs, packed into one initramfs: a second cpio on the rxe guest's carries this
# host's QEMU (its libraries, its TCG module, which Debian builds as a module, and the firmware
# it loads to boot a kernel), vrdmad, and the kernel-driver guest as /opt/nest/kernel and
# /opt/nest/initrd (with CPIO, a gzipped cpio, appended to its initramfs: a later /init replaces
# kmod_guest_init.sh). Sets KERNEL (the rxe guest's) and GUEST_INITRD for peer_rig.sh.
nested_build() {
  local tools=$1 extra=${2:-} rxe_kernel rxe_initrd qemu mods ov f
  guest_build "$SRC/tests/conformance/rxe/make_guest.sh"
  rxe_kernel=$KERNEL rxe_initrd=$INITRD
  mkdir -p "$work/k"
  kmod_guest "$work/k" "$tools"
  ov="$work/overlay"
  mkdir -p "$ov/opt/vrdma" "$ov/opt/nest" "$ov/usr/bin"
  strip --strip-debug -o "$ov/opt/vrdma/vrdmad" "$VRDMAD"
  qemu=$(command -v qemu-system-x86_64)
  cp "$qemu" "$ov/usr/bin/"
  mods=$(dirname "$(readlink -f /usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so)")
  for f in $(for b in "$VRDMAD" "$qemu" "$mods/accel-tcg-x86_64.so"; do ldd "$b" | awk '/=>/ {print $3} /^\t\/lib/ {print $1}'; done | sort -u) \
    "$mods/accel-tcg-x86_64.so" /usr/share/seabios/bios-256k.bin /usr/share/qemu/kvmvapic.bin /usr/share/qemu/linuxboot_dma.bin; do
    [ -e "$f" ] || skip "$f is missing (qemu-system-x86 and seabios install it)"
    mkdir -p "$ov/$(dirname "$f")"
    cp -L "$f" "$ov/$f"
  done
  cp "$KERNEL" "$ov/opt/nest/kernel"
  cat "$INITRD" $extra > "$ov/opt/nest/initrd"
  (cd "$ov" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/overlay.cpio.gz"
  cat "$rxe_initrd" "$work/overlay.cpio.gz" > "$work/initrd"
  KERNEL=$rxe_kernel GUEST_INITRD="$work/initrd"
  echo "guests built after $(($(date +%s) - T0)) s (the rxe guest's initramfs with ours: $(($(stat -c %s "$work/initrd") >> 20)) MiB)"
}

# nested_qemu MIB: the nested guest's QEMU command (for the rxe guest's shell) without its console
# and its carrier's chardev `vr`: MIB of shared memfd RAM, the kernel-driver guest, QEMU's user
# network (the tools' TCP exchange only), the vhost-user-blk-pci carrier on chardev `vr`. The
# caller adds -append, -serial, -chardev socket,id=vr,... and what else it needs.
nested_qemu() {
  echo "qemu-system-x86_64 -accel tcg -cpu max -m $1 -smp 1 -display none -vga none -nodefaults -no-reboot" \
    "-object memory-backend-memfd,id=mem,size=$1M,share=on -numa node,memdev=mem -kernel /opt/nest/kernel -initrd /opt/nest/initrd" \
    "-netdev user,id=n1 -device virtio-net-pci,netdev=n1,romfile= -device vhost-user-blk-pci,chardev=vr,num-queues=4,queue-size=256"
}
