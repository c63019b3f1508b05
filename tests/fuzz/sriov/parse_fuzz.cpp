// Fuzzes every sriov parser of outside text (sysfs attributes, ledger rows, CLI values) and checks
// round-trip properties: a parsed PCI address or MAC prints back to a form that parses the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/libvirt_xml.hpp"
#include "vrdma/sriov/netlink.hpp"
#include "vrdma/sriov/parse.hpp"

using namespace vrdma::sriov;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view s(reinterpret_cast<const char*>(data), size);
  if (auto a = parse_pci_address(s); a.ok()) {
    auto again = parse_pci_address(a->str());
    if (!again.ok() || *again != *a) std::abort();
    if (a->domain <= 0xffff && !interface_hostdev_xml(*a, {}).ok()) std::abort();
    (void)hostdev_xml(*a);
  }
  for (bool unicast : {true, false}) {
    if (auto m = parse_mac(s, unicast); m.ok()) {
      auto again = parse_mac(format_mac(*m), unicast);
      if (!again.ok() || *again != *m) std::abort();
    }
  }
  if (auto v = parse_sysfs_int(s, -1, 65535); v.ok() && (*v < -1 || *v > 65535)) std::abort();
  (void)parse_pci_id(s);
  (void)parse_node_type(s);
  (void)parse_gid_type(s);
  (void)parse_purpose(s);
  (void)parse_vf_link_state(s);
  (void)trim(s);
  HostdevNetworkOptions o;
  o.name = std::string(s.substr(0, 80));
  o.pf_dev = "ens1f0";
  if (auto x = hostdev_network_xml(o); x.ok() && x->find("<name>" + o.name + "</name>") == std::string::npos)
    std::abort();  // accepted names need no escaping
  (void)xml_escape(s);
  return 0;
}
