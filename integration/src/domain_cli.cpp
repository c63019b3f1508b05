// `vrdmactl domain attach|detach`: adds the virtio RDMA device to a libvirt domain XML, or takes
// it out (domain_xml.hpp). Every value is checked before anything is written.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "vrdma/integration/domain_xml.hpp"
#include "vrdma/sriov/parse.hpp"

namespace vrdma::integration {
namespace {

struct DomainArgs {
  AttachOptions o;
  std::string xml_file, port, queue_size;
  std::vector<std::pair<std::string, std::string>> vf;  // (vf-* attribute, value), in order
};

// The domain XML from FILE or standard input ("" or "-").
Result<std::string> read_xml(const std::string& file) {
  std::stringstream in;
  if (file.empty() || file == "-") {
    in << std::cin.rdbuf();
  } else {
    std::ifstream f(file);
    if (!f) return make_error(Errc::not_found, "cannot read " + file + "; give a domain XML file or - for standard input");
    in << f.rdbuf();
  }
  return in.str();
}

int fail(const char* cmd, const std::string& sentence, int status) {
  std::fprintf(stderr, "vrdmactl domain %s: %s\n", cmd, sentence.c_str());
  return status;
}

int attach(DomainArgs& a) {
  AttachOptions& o = a.o;
  if (!a.port.empty()) {
    if (!o.device.incoming.empty()) return fail("attach", "give --migration-port or --incoming, not both", 2);
    o.device.incoming = "tcp:0.0.0.0:" + a.port;
  }
  if (!a.queue_size.empty()) o.queue_size = static_cast<std::uint16_t>(std::stoul(a.queue_size));
  if (!a.vf.empty()) {
    VfRequest vf;
    for (const auto& [name, value] : a.vf)
      if (auto st = set_vf_attribute(vf, name, value); !st.ok())
        return fail("attach", "--" + name + " takes " + st.error().message + ", not '" + value.substr(0, 32) + "'", 2);
    if (o.device.engine.empty()) o.device.engine = "verbs:vf";
    o.device.vf = vf;
  } else if (is_vf_engine(o.device.engine)) {
    o.device.vf = VfRequest{};
  }
  if (o.device.engine.empty())
    return fail("attach", "say which engine serves the device: --engine soft:IP, verbs:IBDEV or verbs:vf", 2);
  if (const auto why = engine_error(o.device.engine); !why.empty()) return fail("attach", "--engine: " + why, 2);
  auto xml = read_xml(a.xml_file);
  if (!xml) return fail("attach", xml.error().message, 1);
  auto out = attach_device(*xml, o);
  if (!out) return fail("attach", out.error().message, 1);
  std::cout << *out;
  return 0;
}

int detach(const std::string& file) {
  auto xml = read_xml(file);
  if (!xml) return fail("detach", xml.error().message, 1);
  auto out = detach_device(*xml);
  if (!out) return fail("detach", out.error().message, 1);
  std::cout << *out;
  return 0;
}

}  // namespace

void add_domain_commands(CLI::App& top, Commands& out) {
  auto* domain = top.add_subcommand("domain", "a libvirt domain XML with or without the virtio RDMA device");
  domain->require_subcommand(1);
  auto a = std::make_shared<DomainArgs>();
  auto& d = a->o.device;
  auto* at = domain->add_subcommand(
      "attach",
      "Reads a libvirt domain XML (--xml FILE, or standard input) and prints it with the virtio RDMA device attached: "
      "a vhost-user disk on vrdmad's socket (QEMU's vhost-user-blk-pci carries the device), shared memfd memory, and "
      "the vrdma:device metadata the libvirt hook reads. Then: virt-xml-validate FILE domain && virsh create FILE");
  at->add_option("--socket", d.socket, "vrdmad's vhost-user socket (an absolute path)")->required();
  at->add_option("--engine", d.engine,
                 "soft:<guest IPv4>, verbs:<ibdev | PCI address>, or verbs:vf: the hook takes a VF of the host's "
                 "SR-IOV pool for the backend (any --vf-* option implies verbs:vf)")
      ->check(CLI::Validator([](std::string& v) { return engine_error(v); }, "ENGINE", "engine"));
  at->add_option("--xml", a->xml_file, "the domain XML (default: standard input)");
  at->add_option("--mac", d.mac, "the guest device's MAC (its RDMA identity; with verbs:vf the VF gets this MAC)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            auto mac = sriov::parse_mac(v);
            return mac ? "" : mac.error().message;
          },
          "MAC", "mac"));
  at->add_option("--announce", d.announce, "the host interface carrying the guest's address (gratuitous ARP after migration)");
  at->add_option("--control", d.control, "vrdmad's control socket (default: the socket with .ctl)");
  auto* port = at->add_option("--migration-port", a->port, "where a destination vrdmad listens for the device state (all addresses)")
                   ->check(CLI::Range(1, 65535));
  at->add_option("--incoming", d.incoming, "where a destination vrdmad listens for the device state, tcp:IP:PORT")->excludes(port);
  at->add_option("--queue-size", a->queue_size, "the carrier's virtqueue size, a power of two in 16..1024")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const unsigned long n = decimal_in(v, 16, 1024).value_or(0);
            return n != 0 && (n & (n - 1)) == 0 ? "" : "must be a power of two in 16..1024, not " + v.substr(0, 16);
          },
          "N", "queue size"));
  at->add_option("--target", a->o.target, "the guest disk name for the carrier (default: the first free vdX)");
  at->add_option("--poll-us", d.poll_us,
                 "vrdmad's latency mode: it polls for N microseconds after the last work instead of sleeping on the "
                 "guest's kicks (a core's worth of CPU while traffic flows)")
      ->check(CLI::Range(1u, 1000000u));
  at->add_option("--notices", d.notices,
                 "on a NIC: the guest's RDMA address (IPv4 or IPv6; ADDR,ADDR for both); vrdmad tells the backends of "
                 "its QPs' peers where each QP went when the guest moves, and takes their notices there");
  for (const char* name : kVfAttributes) {
    const std::string attribute = name;
    at->add_option_function<std::string>(
        "--" + attribute, [a, attribute](const std::string& v) { a->vf.emplace_back(attribute, v); },
        attribute == "vf-pool"       ? "the PF whose VFs to take (PCI address or netdev; default any PF)"
        : attribute == "vf-numa"     ? "take a VF on this NUMA node"
        : attribute == "vf-vlan"     ? "the VF's VLAN (0..4094)"
        : attribute == "vf-max-rate" ? "the VF's tx rate limit, Mb/s (0: none)"
        : attribute == "vf-trust"    ? "the VF's trust, on|off"
                                     : "the VF's spoof check, on|off");
  }
  out.push_back({at, [a] { return attach(*a); }});
  auto* dt = domain->add_subcommand(
      "detach", "Reads a libvirt domain XML and prints it without the virtio RDMA device (its disk and metadata)");
  dt->add_option("--xml", a->xml_file, "the domain XML (default: standard input)");
  out.push_back({dt, [a] { return detach(a->xml_file); }});
}

}  // namespace vrdma::integration
