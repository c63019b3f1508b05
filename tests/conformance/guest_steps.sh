# Sourced by the /init of the test guests that take commands from the host (guest_pack puts this
# file at /steps.sh in every initramfs): the start-up and the serial-console protocol they share.

# init_guest MODULE...: mounts /proc, /sys and /dev, makes /tmp and /dev/pts, then loads each
# module, saying so on the console when one does not load.
init_guest() {
  mount -t proc proc /proc
  mount -t sysfs sys /sys
  mount -t devtmpfs dev /dev
  mkdir -p /dev/pts /tmp
  for m in "$@"; do
    modprobe "$m" 2>/dev/null || echo "guest: modprobe $m failed"
  done
}

# serve_steps: runs the host's commands. The host writes "STEP <n> <shell command>" lines to the
# serial console; the guest answers "=== BEGIN <n>", the command's output and
# "=== END <n> rc=<status>". "QUIT" (or the end of the console) powers the guest off.
serve_steps() {
  while read -r word n cmd; do
    case "$word" in
      STEP)
        echo "=== BEGIN $n"
        sh -c "$cmd" 2>&1
        echo "=== END $n rc=$?"
        ;;
      QUIT) break ;;
    esac
  done
  poweroff -f
}
