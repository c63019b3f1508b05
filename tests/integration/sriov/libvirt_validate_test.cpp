// The libvirt XML we generate, checked by libvirt's own schemas (virt-xml-validate).
#define BOOST_TEST_MODULE sriov_libvirt_validate
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "vrdma/sriov/libvirt_xml.hpp"

using namespace vrdma::sriov;
namespace fs = std::filesystem;

namespace {
bool have_validator() { return std::system("command -v virt-xml-validate >/dev/null 2>&1") == 0; }

// Validates `doc` as schema `kind` ("domain", "network"); returns virt-xml-validate's status.
int validate(const std::string& doc, const std::string& kind) {
  fs::path p = fs::temp_directory_path() / ("vrdma-xml-" + std::to_string(getpid()) + "-" + kind + ".xml");
  std::ofstream(p) << doc;
  int rc = std::system(("virt-xml-validate " + p.string() + " " + kind + " >/dev/null 2>&1").c_str());
  fs::remove(p);
  return rc;
}

std::string domain_with(const std::string& devices) {
  return "<domain type='kvm'>\n  <name>vrdma-test</name>\n  <memory unit='MiB'>512</memory>\n"
         "  <os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n  </os>\n  <devices>\n" +
         devices + "  </devices>\n</domain>\n";
}

PciAddress pci(const char* s) { return *parse_pci_address(s); }

#define SKIP_WITHOUT_VALIDATOR()                                                                       \
  if (!have_validator()) {                                                                             \
    BOOST_TEST_MESSAGE("SKIP: virt-xml-validate is not installed (apt-get install libvirt-clients)"); \
    return;                                                                                            \
  }
}  // namespace

BOOST_AUTO_TEST_CASE(hostdev_fragment_validates_inside_a_domain) {
  SKIP_WITHOUT_VALIDATOR();
  BOOST_TEST(validate(domain_with(hostdev_xml(pci("0000:af:00.3"))), "domain") == 0);
  BOOST_TEST(validate(domain_with(hostdev_xml(pci("0000:3b:02.1"), false)), "domain") == 0);
}

BOOST_AUTO_TEST_CASE(interface_hostdev_fragment_validates_inside_a_domain) {
  SKIP_WITHOUT_VALIDATOR();
  InterfaceXmlOptions o;
  o.mac = *parse_mac("02:00:5e:10:00:01");
  o.vlan = 42;
  auto x = interface_hostdev_xml(pci("0000:af:00.2"), o);
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(validate(domain_with(*x), "domain") == 0);
  auto bare = interface_hostdev_xml(pci("0000:5e:01.0"), {});
  BOOST_TEST(validate(domain_with(*bare), "domain") == 0);
}

BOOST_AUTO_TEST_CASE(hostdev_network_pools_validate) {
  SKIP_WITHOUT_VALIDATOR();
  HostdevNetworkOptions pf{"vrdma-cx5", std::string("ens3f0np0"), {}};
  BOOST_TEST(validate(*hostdev_network_xml(pf), "network") == 0);
  HostdevNetworkOptions list{"vrdma-qede.0", std::nullopt, {pci("0000:3b:00.2"), pci("0000:3b:00.3")}};
  BOOST_TEST(validate(*hostdev_network_xml(list), "network") == 0);
}

BOOST_AUTO_TEST_CASE(the_validator_does_reject_broken_xml) {
  // Guards the test itself: a validator that accepts everything would prove nothing.
  SKIP_WITHOUT_VALIDATOR();
  BOOST_TEST(validate(domain_with("<hostdev mode='subsystem' type='pci'><source/></hostdev>\n"), "domain") != 0);
  BOOST_TEST(validate("<network><forward mode='hostdev'/></network>", "network") != 0);
}
