# Sourced by the libvirt VM tests and scripts/demo.sh: the libvirt hook they install and the plain
# domain XML of the guest (tests/conformance/vm: Debian kernel and initramfs under TCG), before
# `vrdmactl domain attach` adds the device.

# vm_hook [VAR=VALUE...]: $W/hook, the QEMU hook two_hosts.sh installs on its hosts (LV_HOOK,
# exported): `$VRDMACTL hook qemu` with the VARs (VRDMA_VRDMAD, VRDMA_WRITE_JOURNAL, ...) and
# VRDMA_HOOK_LOG=$W/hook.log in its environment.
vm_hook() {
  printf '#!/bin/sh\n%s VRDMA_HOOK_LOG=%s/hook.log exec %s hook qemu "$@"\n' "$*" "$W" "$VRDMACTL" > "$W/hook"
  chmod 755 "$W/hook"
  export LV_HOOK=$W/hook
}

#   vm_domain_xml NAME MIB CMDLINE NIC_MAC TAP CONSOLE_LOG   (KERNEL and INITRD from the environment)
vm_domain_xml() {
  cat <<X
<domain type='qemu'>
  <name>$1</name>
  <memory unit='MiB'>$2</memory>
  <vcpu current='1'>2</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><kernel>$KERNEL</kernel><initrd>$INITRD</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 no_timer_check $3</cmdline></os>
  <cpu mode='maximum' migratable='on'><feature policy='disable' name='la57'/></cpu>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='ethernet'><mac address='$4'/><target dev='$5' managed='no'/><model type='virtio'/></interface>
    <serial type='file'><source path='$6' append='on'/></serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
X
}
