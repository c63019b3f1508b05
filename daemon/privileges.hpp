// vrdmad's privileges once it starts serving (docs/virtio-rdma.md "What vrdmad keeps"): a backend started as
// root by the libvirt hook keeps only the capabilities its serving needs, and can never gain any
// again (no new privileges, a bounding set as small), so that a guest or frontend that found a
// flaw in it would hold a process that cannot load modules, trace others, override file
// permissions or change its identity.
#pragma once

#include <string>

#include "vrdma/common/result.hpp"

namespace vrdma::vrdmad {

// Drops every capability but CAP_CHOWN (the vhost-user socket's group, --socket-group),
// CAP_NET_ADMIN (a move turns ARP and IPv6 off and on on the interface
// that announces the guest's address), CAP_NET_RAW (the soft engine's raw socket, the gratuitous
// ARP after a move) and CAP_IPC_LOCK (pinning guest memory for a NIC's memory registrations) from the
// effective, permitted, inheritable, ambient and bounding sets, and sets no-new-privileges. Called
// before any RDMA device is opened (the kernel ties a uverbs file to the credentials that opened
// it: a later change makes its write() commands fail with EACCES). A process without capabilities (not root)
// loses nothing and gets no-new-privileges. Returns what the process now holds, in words.
Result<std::string> drop_privileges();

}  // namespace vrdma::vrdmad
