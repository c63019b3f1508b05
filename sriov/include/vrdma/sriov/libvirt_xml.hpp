// Libvirt forms of an assignment (https://libvirt.org/formatdomain.html#host-device-assignment,
// formatnetwork.html "forward mode='hostdev'"). Output is a fragment for <devices> or a whole
// <network> document; every attribute value is escaped, names are checked.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/sriov/parse.hpp"

namespace vrdma::sriov {

// <hostdev mode='subsystem' type='pci' managed='yes'> for the VF's PCI address.
std::string hostdev_xml(const PciAddress& vf, bool managed = true);

struct InterfaceXmlOptions {
  std::optional<MacAddress> mac;
  std::optional<std::uint16_t> vlan;  // 1..4094
  bool managed = true;
};
// <interface type='hostdev'>: libvirt sets MAC/VLAN through the PF before handing the VF over.
Result<std::string> interface_hostdev_xml(const PciAddress& vf, const InterfaceXmlOptions& opts);

struct HostdevNetworkOptions {
  std::string name;                   // network name: [A-Za-z0-9_.-], 1..64 chars
  std::optional<std::string> pf_dev;  // <pf dev='...'/>: libvirt enumerates the VFs itself
  std::vector<PciAddress> vfs;        // or an explicit VF list (<address type='pci' .../>)
};
// A whole <network> with <forward mode='hostdev' managed='yes'>. Errors: invalid_argument.
Result<std::string> hostdev_network_xml(const HostdevNetworkOptions& opts);

// Escapes &, <, >, ', " for XML attribute and text content.
std::string xml_escape(std::string_view s);

}  // namespace vrdma::sriov
