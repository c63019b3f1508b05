// The libvirt QEMU hook: libvirt runs /etc/libvirt/hooks/qemu DOMAIN OPERATION SUB-OPERATION
// EXTRA with the domain XML on stdin (https://libvirt.org/hooks.html). For domains whose XML
// carries a vrdma:device element (domain_xml.hpp):
//   migrate begin   (destination) start the backend for this host, vrdmad as a migration
//                   destination (--incoming), and print the XML with the socket paths rewritten
//                   to this host's (what the hook prints replaces the incoming XML)
//   prepare begin, start begin   make sure the backend runs (start it if not)
//   release end     stop the backend, remove its sockets
// With engine="verbs:vf" the backend gets a VF of this host's pool first (guest_vf.hpp): the
// domain's own VF again, or a free one, configured on migrate begin, prepare begin and start
// begin (unless the backend already runs), vrdmad started on its RDMA device and holding it in
// the ledger; reset and given back on release end (or when starting fails). $VRDMA_SYSFS_ROOT
// and $VRDMA_VF_LEDGER say where sysfs and the VF ledger are.
// Other domains and operations: nothing, exit 0. Failures: one sentence on `err` (libvirt shows
// it to the operator and aborts the operation) and exit status 1; 2 on a usage error.
#pragma once

#include <istream>
#include <ostream>
#include <string>
#include <vector>

namespace vrdma::integration {

// args excludes "hook qemu": {DOMAIN, OPERATION, SUB-OPERATION, EXTRA}.
// $VRDMA_HOOK_LOG names a file that gets one line per call (host, domain, operation, action).
int hook_qemu_run(const std::vector<std::string>& args, std::istream& in, std::ostream& out, std::ostream& err);

}  // namespace vrdma::integration
