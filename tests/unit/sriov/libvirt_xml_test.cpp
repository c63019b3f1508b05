#define BOOST_TEST_MODULE sriov_libvirt_xml
#include <boost/test/unit_test.hpp>

#include "vrdma/sriov/libvirt_xml.hpp"

using namespace vrdma;
using namespace vrdma::sriov;

namespace {
PciAddress pci(const char* s) { return *parse_pci_address(s); }
bool has(const std::string& s, const char* t) { return s.find(t) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(hostdev_names_the_vf_pci_address_in_libvirt_hex_form) {
  auto x = hostdev_xml(pci("0000:af:00.3"));
  BOOST_TEST(has(x, "<hostdev mode='subsystem' type='pci' managed='yes'>"));
  BOOST_TEST(has(x, "<address domain='0x0000' bus='0xaf' slot='0x00' function='0x3'/>"));
  BOOST_TEST(has(hostdev_xml(pci("0000:af:00.3"), false), "managed='no'"));
}

BOOST_AUTO_TEST_CASE(interface_hostdev_carries_mac_and_vlan) {
  InterfaceXmlOptions o;
  o.mac = *parse_mac("02:00:5e:10:00:01");
  o.vlan = 42;
  auto x = interface_hostdev_xml(pci("0000:3b:00.2"), o);
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(has(*x, "<interface type='hostdev' managed='yes'>"));
  BOOST_TEST(has(*x, "<mac address='02:00:5e:10:00:01'/>"));
  BOOST_TEST(has(*x, "<address type='pci' domain='0x0000' bus='0x3b' slot='0x00' function='0x2'/>"));
  BOOST_TEST(has(*x, "<tag id='42'/>"));
  o.vlan = 0;
  BOOST_TEST(!interface_hostdev_xml(pci("0000:3b:00.2"), o).ok());
  BOOST_TEST(!interface_hostdev_xml(pci("10000:01:00.0"), {}).ok());  // libvirt caps domains at 0xffff
}

BOOST_AUTO_TEST_CASE(hostdev_network_takes_a_pf_or_a_vf_list_and_checks_the_name) {
  HostdevNetworkOptions o;
  o.name = "vrdma-ens3f0np0";
  o.pf_dev = "ens3f0np0";
  auto x = hostdev_network_xml(o);
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(has(*x, "<forward mode='hostdev' managed='yes'>"));
  BOOST_TEST(has(*x, "<pf dev='ens3f0np0'/>"));
  o.vfs = {pci("0000:af:00.2")};
  BOOST_TEST(!hostdev_network_xml(o).ok());  // both
  o.pf_dev.reset();
  x = hostdev_network_xml(o);
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(has(*x, "function='0x2'"));
  for (const char* bad : {"", "a b", "x'><script>", "../etc", "name/with/slash"}) {
    o.name = bad;
    BOOST_TEST(!hostdev_network_xml(o).ok(), bad);
  }
  o.name = std::string(65, 'n');
  BOOST_TEST(!hostdev_network_xml(o).ok());
}

BOOST_AUTO_TEST_CASE(xml_escape_escapes_all_five_specials) {
  BOOST_TEST(xml_escape("a<b>&'\"") == "a&lt;b&gt;&amp;&apos;&quot;");
}
