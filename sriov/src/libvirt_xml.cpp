#include "vrdma/sriov/libvirt_xml.hpp"

#include <fmt/format.h>

namespace vrdma::sriov {
namespace {

std::string pci_source_address(const PciAddress& a, bool with_type) {
  return fmt::format("<address{} domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/>",
                     with_type ? " type='pci'" : "", a.domain, a.bus, a.device, a.function);
}

Status check_domain(const PciAddress& a) {
  // libvirt's schema (basictypes.rng pciDomain) allows at most 0xffff.
  if (a.domain > 0xffff)
    return make_error(Errc::invalid_argument, fmt::format("libvirt cannot address PCI domain 0x{:x} of {}; it accepts "
                                                          "domains up to 0xffff",
                                                          a.domain, a.str()));
  return {};
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&apos;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string hostdev_xml(const PciAddress& vf, bool managed) {
  return fmt::format(
      "<hostdev mode='subsystem' type='pci' managed='{}'>\n"
      "  <driver name='vfio'/>\n"
      "  <source>\n"
      "    {}\n"
      "  </source>\n"
      "</hostdev>\n",
      managed ? "yes" : "no", pci_source_address(vf, false));
}

Result<std::string> interface_hostdev_xml(const PciAddress& vf, const InterfaceXmlOptions& o) {
  VRDMA_TRY(check_domain(vf));
  if (o.vlan && (*o.vlan == 0 || *o.vlan > 4094))
    return make_error(Errc::invalid_argument, fmt::format("VLAN {} is out of range; libvirt takes 1..4094", *o.vlan));
  std::string x = fmt::format("<interface type='hostdev' managed='{}'>\n", o.managed ? "yes" : "no");
  if (o.mac) x += fmt::format("  <mac address='{}'/>\n", format_mac(*o.mac));
  x += "  <driver name='vfio'/>\n";
  x += fmt::format("  <source>\n    {}\n  </source>\n", pci_source_address(vf, true));
  if (o.vlan) x += fmt::format("  <vlan>\n    <tag id='{}'/>\n  </vlan>\n", *o.vlan);
  x += "</interface>\n";
  return x;
}

Result<std::string> hostdev_network_xml(const HostdevNetworkOptions& o) {
  if (o.name.empty() || o.name.size() > 64)
    return make_error(Errc::invalid_argument, "a libvirt network name must be 1 to 64 characters long");
  for (char c : o.name) {
    bool okc = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
               c == '.';
    if (!okc)
      return make_error(Errc::invalid_argument,
                        "a network name may contain only letters, digits, '-', '_' and '.' (libvirt uses it in paths)");
  }
  if (o.pf_dev.has_value() == !o.vfs.empty())
    return make_error(Errc::invalid_argument, "a hostdev network needs either the PF netdev or a list of VFs, not both");
  std::string x = fmt::format("<network>\n  <name>{}</name>\n  <forward mode='hostdev' managed='yes'>\n"
                              "    <driver name='vfio'/>\n",
                              xml_escape(o.name));
  if (o.pf_dev) {
    if (o.pf_dev->empty() || o.pf_dev->size() > 15)
      return make_error(Errc::invalid_argument, "a PF netdev name must be 1 to 15 characters long");
    x += fmt::format("    <pf dev='{}'/>\n", xml_escape(*o.pf_dev));
  }
  for (const auto& vf : o.vfs) {
    VRDMA_TRY(check_domain(vf));
    x += "    " + pci_source_address(vf, true) + "\n";
  }
  x += "  </forward>\n</network>\n";
  return x;
}

}  // namespace vrdma::sriov
