// `vrdmactl domain attach|detach`: adds the virtio RDMA device to a libvirt domain XML, or takes
// it out (domain_xml.hpp). Every value is checked before anything is written.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <chrono>
#include <thread>

#include "backend_proc.hpp"
#include "commands.hpp"
#include "libvirt_handles.hpp"
#include "vf_pool.hpp"
#include "vrdma/integration/domain_xml.hpp"
#include "vrdma/sriov/parse.hpp"

namespace vrdma::integration {
namespace {

struct DomainArgs {
  AttachOptions o;
  std::string xml_file, port, queue_size;
  std::string live, connect;  // --live DOMAIN on libvirt at --connect (hot-plug)
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

// The XML of the running domain `name` on libvirt `uri` (for `cmd`, attach or detach), or a sentence.
Result<std::string> open_live(Conn& conn, Dom& dom, const std::string& uri, const std::string& name, const char* cmd) {
  virSetErrorFunc(nullptr, silent_libvirt_error);
  conn.c = virConnectOpen(uri.c_str());
  if (!conn.c) return make_error(Errc::connection_lost, "cannot connect to libvirtd at " + uri + ": " + last_libvirt_error());
  dom.d = virDomainLookupByName(conn.c, name.c_str());
  if (!dom.d) return make_error(Errc::not_found, "there is no domain " + name + " on " + uri);
  if (virDomainIsActive(dom.d) != 1)
    return make_error(Errc::bad_state, "domain " + name + " is not running: without --live, " + cmd + " works on its XML (--xml)");
  char* xml = virDomainGetXMLDesc(dom.d, 0);
  if (!xml) return make_error(Errc::io_error, "cannot read domain " + name + "'s XML: " + last_libvirt_error());
  std::string out(xml);
  std::free(xml);
  return out;
}

// Hot-plug: the backend first (as the hook does at start), then the carrier disk, then the
// metadata the hook reads at migration and release; whatever fails undoes what came before.
int attach_live(const DomainArgs& a) {
  const std::string uri = libvirt_uri(a.connect);
  Conn conn;
  Dom dom;
  auto xml = open_live(conn, dom, uri, a.live, "attach");
  if (!xml) return fail("attach", xml.error().message, 1);
  auto parts = live_attach_parts(*xml, a.o);
  if (!parts) return fail("attach", parts.error().message, 1);
  const auto host = short_hostname();
  auto started = start_device_backend(a.live, host, parts->device, false, false, BackendPrograms::from_environment());
  if (!started) return fail("attach", started.error().message, 1);
  if (virDomainAttachDeviceFlags(dom.d, parts->disk.c_str(), VIR_DOMAIN_AFFECT_LIVE) != 0) {
    const std::string why = last_libvirt_error();
    (void)stop_device_backend(a.live, host, parts->device);
    return fail("attach", "libvirt did not hot-plug the device into domain " + a.live + ": " + why, 1);
  }
  if (virDomainSetMetadata(dom.d, VIR_DOMAIN_METADATA_ELEMENT, parts->metadata.c_str(), "vrdma", kMetadataNamespace,
                           VIR_DOMAIN_AFFECT_LIVE) != 0) {
    const std::string why = last_libvirt_error();
    (void)virDomainDetachDeviceFlags(dom.d, parts->disk.c_str(), VIR_DOMAIN_AFFECT_LIVE);
    (void)stop_device_backend(a.live, host, parts->device);
    return fail("attach", "libvirt did not take the vrdma:device metadata of domain " + a.live + " (the device was "
                              "unplugged again): " + why, 1);
  }
  const int pid = backend_pid(parts->device);
  std::printf("Domain %s has the virtio RDMA device now: vrdmad (pid %d, engine %s%s) serves %s. Inside the guest, "
              "virtio_rdma.ko takes it, or pvverbs-bind for libpvverbs. It stays until the domain stops or "
              "'vrdmactl domain detach --live %s'; the domain's persistent XML does not have it.\n",
              a.live.c_str(), pid, parts->device.engine.c_str(), started->c_str(), parts->device.socket.c_str(),
              a.live.c_str());
  return 0;
}

// Hot-unplug: the guest lets go of the carrier (ACPI eject), then the backend stops and the
// metadata goes. A guest that does not let go within --timeout keeps both, and is told.
int detach_live(const DomainArgs& a, int timeout_s) {
  const std::string uri = libvirt_uri(a.connect);
  Conn conn;
  Dom dom;
  auto xml = open_live(conn, dom, uri, a.live, "detach");
  if (!xml) return fail("detach", xml.error().message, 1);
  auto parts = live_detach_parts(*xml);
  if (!parts) return fail("detach", parts.error().message, 1);
  if (virDomainDetachDeviceFlags(dom.d, parts->disk.c_str(), VIR_DOMAIN_AFFECT_LIVE) != 0)
    return fail("detach", "libvirt did not unplug the device from domain " + a.live + ": " + last_libvirt_error(), 1);
  // libvirt returns once QEMU has asked the guest; the guest's ACPI eject may take longer.
  // A domain that stopped meanwhile took the device with it (and its hook stopped the backend).
  bool gone = false, stopped_domain = false;
  for (int i = 0; i < timeout_s * 10 && !gone; ++i) {
    char* now = virDomainIsActive(dom.d) == 1 ? virDomainGetXMLDesc(dom.d, 0) : nullptr;
    if (now == nullptr) {
      gone = stopped_domain = true;
      break;
    }
    gone = !has_carrier_disk(now, parts->device.socket);
    std::free(now);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!gone)
    return fail("detach", "domain " + a.live + "'s guest has not released the device within " + std::to_string(timeout_s) +
                              " s (its kernel answers ACPI eject requests; a guest still using it may hold it): vrdmad "
                              "keeps serving " + parts->device.socket + "; run this again later", 1);
  auto stopped = stop_device_backend(a.live, short_hostname(), parts->device);
  if (!stopped_domain)
    (void)virDomainSetMetadata(dom.d, VIR_DOMAIN_METADATA_ELEMENT, nullptr, "vrdma", kMetadataNamespace,
                               VIR_DOMAIN_AFFECT_LIVE);
  if (!stopped) return fail("detach", stopped.error().message, 1);
  std::printf("Domain %s no longer has the virtio RDMA device: %s and vrdmad on %s stopped%s.\n", a.live.c_str(),
              stopped_domain ? "the domain stopped meanwhile" : "the guest released it", parts->device.socket.c_str(),
              stopped->log_part().c_str());
  return 0;
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
  if (!a.live.empty()) return attach_live(a);
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

// --live DOMAIN (instead of --xml) and --connect URI, for attach and detach.
CLI::Option* add_live_options(CLI::App& cmd, DomainArgs& a, CLI::Option* xml, const std::string& what) {
  auto* live = cmd.add_option("--live", a.live, what)->excludes(xml);
  cmd.add_option("--connect", a.connect, "with --live: libvirt's URI (default $LIBVIRT_DEFAULT_URI, else qemu:///system)")
      ->needs(live);
  return live;
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
  auto* xml = at->add_option("--xml", a->xml_file, "the domain XML (default: standard input)");
  add_live_options(*at, *a, xml,
                   "hot-plug into this running domain instead: start vrdmad (as the hook would), plug the device in "
                   "with libvirt and set its metadata; the domain needs shared memory from boot");
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
  auto* dxml = dt->add_option("--xml", a->xml_file, "the domain XML (default: standard input)");
  auto* dlive = add_live_options(*dt, *a, dxml,
                                 "hot-unplug from this running domain instead: the guest lets go of the device, then "
                                 "vrdmad stops and the metadata goes");
  auto timeout = std::make_shared<int>(30);
  dt->add_option("--timeout", *timeout, "with --live: seconds the guest has to release the device")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str()
      ->needs(dlive);
  out.push_back({dt, [a, timeout] { return a->live.empty() ? detach(a->xml_file) : detach_live(*a, *timeout); }});
}

}  // namespace vrdma::integration
