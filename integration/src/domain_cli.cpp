// `vrdmactl domain attach`: adds the virtio RDMA device to a libvirt domain XML (domain_xml.hpp).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "vrdma/integration/domain_xml.hpp"

namespace vrdma::integration {
namespace {

int usage() {
  std::fprintf(stderr,
               "usage: vrdmactl domain attach --socket PATH --engine ENGINE [--xml FILE] [--mac MAC] [--announce IF]\n"
               "                              [--migration-port P | --incoming tcp:IP:PORT] [--control PATH]\n"
               "                              [--queue-size N] [--target vdX] [--poll-us N] [--notices IP[,IP]]\n"
               "                              [--vf-pool PF] [--vf-numa N] [--vf-vlan V] [--vf-max-rate MBPS]\n"
               "                              [--vf-trust on|off] [--vf-spoofchk on|off]\n"
               "  Reads a libvirt domain XML (FILE, or standard input) and prints it with the virtio RDMA device\n"
               "  attached: a vhost-user disk on vrdmad's socket (QEMU's vhost-user-blk-pci carries the device),\n"
               "  shared memfd memory, and the vrdma:device metadata the libvirt hook reads.\n"
               "  --engine          soft:<guest IPv4>, verbs:<ibdev | PCI address>, or verbs:vf: the hook takes a VF\n"
               "                    of the host's SR-IOV pool for the backend (any --vf-* option implies verbs:vf)\n"
               "  --vf-pool         the PF whose VFs to take (PCI address or netdev; default any PF)\n"
               "  --vf-numa         take a VF on this NUMA node\n"
               "  --vf-vlan, --vf-max-rate, --vf-trust, --vf-spoofchk   the VF's VLAN, tx rate limit (Mb/s), trust, spoof-check\n"
               "  --mac             the guest device's MAC (its RDMA identity; with verbs:vf the VF gets this MAC)\n"
               "  --announce        the host interface carrying the guest's address (gratuitous ARP after migration)\n"
               "  --migration-port  where a destination vrdmad listens for the device state (all addresses)\n"
               "  --poll-us         vrdmad's latency mode: it polls for N microseconds after the last work instead of\n"
               "                    sleeping on the guest's kicks (a core's worth of CPU while traffic flows; 1..1000000)\n"
               "  --notices         on a NIC: the guest's RDMA address (IPv4 or IPv6; ADDR,ADDR for both); vrdmad tells\n"
               "                    the backends of its QPs' peers\n"
               "                    where each QP went when the guest moves, and takes their notices there\n"
               "Then: virt-xml-validate FILE domain && virsh create FILE\n");
  return 2;
}

}  // namespace

int domain_cli(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "attach") return usage();
  AttachOptions o;
  std::string xml_file, port;
  VfRequest vf;
  bool want_vf = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= args.size()) return false;
      out = args[++i];
      return true;
    };
    std::string qs;
    bool ok = true;
    if (a == "--socket") ok = value(o.device.socket);
    else if (a == "--engine") ok = value(o.device.engine);
    else if (a == "--xml") ok = value(xml_file);
    else if (a == "--mac") ok = value(o.device.mac);
    else if (a == "--announce") ok = value(o.device.announce);
    else if (a == "--control") ok = value(o.device.control);
    else if (a == "--incoming") ok = value(o.device.incoming);
    else if (a == "--migration-port") ok = value(port);
    else if (a == "--target") ok = value(o.target);
    else if (a == "--notices") ok = value(o.device.notices);
    else if (a == "--poll-us") {
      std::string v;
      ok = value(v);
      const auto n = decimal_in(v, 1, 1000000);
      if (ok && !n) {
        std::fprintf(stderr, "vrdmactl domain attach: --poll-us must be 1..1000000 (microseconds)\n");
        return 2;
      }
      o.device.poll_us = static_cast<unsigned>(n.value_or(0));
    }
    else if (a.rfind("--vf-", 0) == 0) {
      std::string v;
      if (!value(v)) {
        std::fprintf(stderr, "vrdmactl domain attach: %s needs a value\n", a.c_str());
        return 2;
      }
      want_vf = true;
      if (auto st = set_vf_attribute(vf, a.substr(2), v); !st.ok()) {
        if (st.error().is(Errc::not_found)) {
          std::fprintf(stderr, "vrdmactl domain attach: unknown option %s\n", a.c_str());
          return usage();
        }
        std::fprintf(stderr, "vrdmactl domain attach: %s takes %s, not '%s'\n", a.c_str(),
                     st.error().message.c_str(), v.substr(0, 32).c_str());
        return 2;
      }
    } else if (a == "--queue-size") {
      ok = value(qs);
      const unsigned long v = decimal_in(qs, 16, 1024).value_or(0);
      if (v == 0 || (v & (v - 1)) != 0) {
        std::fprintf(stderr, "vrdmactl domain attach: --queue-size must be a power of two in 16..1024\n");
        return 2;
      }
      o.queue_size = static_cast<std::uint16_t>(v);
    } else {
      std::fprintf(stderr, "vrdmactl domain attach: unknown option %s\n", a.c_str());
      return usage();
    }
    if (!ok) {
      std::fprintf(stderr, "vrdmactl domain attach: %s needs a value\n", a.c_str());
      return 2;
    }
  }
  if (!port.empty()) {
    if (!o.device.incoming.empty()) {
      std::fprintf(stderr, "vrdmactl domain attach: give --migration-port or --incoming, not both\n");
      return 2;
    }
    if (!decimal_in(port, 1, 65535)) {
      std::fprintf(stderr, "vrdmactl domain attach: --migration-port must be 1..65535\n");
      return 2;
    }
    o.device.incoming = "tcp:0.0.0.0:" + port;
  }
  if (want_vf) {
    if (o.device.engine.empty()) o.device.engine = "verbs:vf";
    o.device.vf = vf;
  } else if (is_vf_engine(o.device.engine)) {
    o.device.vf = VfRequest{};
  }
  std::stringstream in;
  if (xml_file.empty() || xml_file == "-") {
    in << std::cin.rdbuf();
  } else {
    std::ifstream f(xml_file);
    if (!f) {
      std::fprintf(stderr, "vrdmactl domain attach: cannot read %s\n", xml_file.c_str());
      return 1;
    }
    in << f.rdbuf();
  }
  auto out = attach_device(in.str(), o);
  if (!out) {
    std::fprintf(stderr, "vrdmactl domain attach: %s\n", out.error().message.c_str());
    return 1;
  }
  std::cout << *out;
  return 0;
}

}  // namespace vrdma::integration
