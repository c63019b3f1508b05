# Runs at install time (integration/CMakeLists.txt's install(CODE)), when CMAKE_INSTALL_PREFIX is
# the prefix given then (`cmake --install build --prefix /usr`): writes the files that name
# installed paths (the libvirt hook, vrdma@.service, the AppArmor abstraction) for that prefix
# and installs them with the defaults file. DESTDIR is honoured by file(INSTALL).
# In: VRDMA_LAYOUT_SOURCE (integration/), VRDMA_LAYOUT_BINARY (a scratch folder), and the
# relative VRDMA_LAYOUT_BINDIR, _SBINDIR, _DOCDIR of GNUInstallDirs.
set(prefix "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/+$" "" prefix "${prefix}")
# The configuration folder as GNUInstallDirs places it: /etc for the prefixes / and /usr,
# /etc/opt/NAME for /opt/NAME, PREFIX/etc otherwise (/usr/local/etc).
if(prefix STREQUAL "" OR prefix STREQUAL "/usr")
  set(etc "/etc")
elseif(prefix MATCHES "^/opt/(.+)$")
  set(etc "/etc/opt/${CMAKE_MATCH_1}")
else()
  set(etc "${prefix}/etc")
endif()
# The names the templates use.
set(CMAKE_INSTALL_FULL_SYSCONFDIR "${etc}")
set(CMAKE_INSTALL_FULL_SBINDIR "${prefix}/${VRDMA_LAYOUT_SBINDIR}")
set(CMAKE_INSTALL_FULL_DOCDIR "${prefix}/${VRDMA_LAYOUT_DOCDIR}")
set(VRDMACTL "${prefix}/${VRDMA_LAYOUT_BINDIR}/vrdmactl")
set(VRDMA_RUN_DIR "/run/vrdma")

set(out "${VRDMA_LAYOUT_BINARY}")
file(MAKE_DIRECTORY "${out}/hooks" "${out}/systemd" "${out}/apparmor")
configure_file("${VRDMA_LAYOUT_SOURCE}/hooks/qemu" "${out}/hooks/vrdma" @ONLY)
configure_file("${VRDMA_LAYOUT_SOURCE}/systemd/vrdma@.service.in" "${out}/systemd/vrdma@.service" @ONLY)
configure_file("${VRDMA_LAYOUT_SOURCE}/apparmor/vrdma-qemu" "${out}/apparmor/vrdma-qemu" @ONLY)
file(INSTALL DESTINATION "${etc}/libvirt/hooks/qemu.d" TYPE PROGRAM FILES "${out}/hooks/vrdma")
file(INSTALL DESTINATION "${prefix}/lib/systemd/system" TYPE FILE FILES "${out}/systemd/vrdma@.service")
file(INSTALL DESTINATION "${etc}/apparmor.d/abstractions" TYPE FILE FILES "${out}/apparmor/vrdma-qemu")
file(INSTALL DESTINATION "${etc}/default" TYPE FILE FILES "${VRDMA_LAYOUT_SOURCE}/systemd/vrdma.default"
     RENAME vrdma)
