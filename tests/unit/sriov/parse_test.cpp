#define BOOST_TEST_MODULE sriov_parse
#include <boost/test/unit_test.hpp>

#include "vrdma/sriov/netlink.hpp"
#include "vrdma/sriov/parse.hpp"

using namespace vrdma;
using namespace vrdma::sriov;

BOOST_AUTO_TEST_CASE(pci_address_round_trips_full_and_short_forms) {
  auto a = parse_pci_address("0000:3b:02.1");
  BOOST_REQUIRE(a.ok());
  BOOST_TEST(a->bus == 0x3b);
  BOOST_TEST(a->device == 2);
  BOOST_TEST(a->function == 1);
  BOOST_TEST(a->str() == "0000:3b:02.1");
  auto s = parse_pci_address("AF:00.7\n");
  BOOST_REQUIRE(s.ok());
  BOOST_TEST(s->str() == "0000:af:00.7");
  auto vmd = parse_pci_address("10000:01:00.0");  // VMD domains exceed 0xffff
  BOOST_REQUIRE(vmd.ok());
  BOOST_TEST(vmd->str() == "10000:01:00.0");
}

BOOST_AUTO_TEST_CASE(pci_address_rejects_malformed_input_with_a_sentence) {
  for (const char* bad : {"", "3b:02", "0000:3b:02.8", "0000:3b:20.0", "0000:3b:2.0", "0000:3bb:02.0", "zz:00.0",
                          ":3b:00.0", "0000:3b:00.0.0", "0000:3b:00.", "0000:3b:00.-1", "123456789:00:00.0",
                          "0000:3b:00.0 trailing", "0000\n:3b:00.0", "+0:3b:00.0"}) {
    auto r = parse_pci_address(bad);
    BOOST_TEST(!r.ok(), bad);
    if (!r.ok()) {
      BOOST_TEST(r.error().is(Errc::invalid_argument));
      BOOST_TEST(r.error().message.find("is not a PCI address") != std::string::npos);
    }
  }
  auto r = parse_pci_address(std::string("00\x01:3b:00.0", 11));
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().message.find("\\x01") != std::string::npos);  // control bytes are escaped
}

BOOST_AUTO_TEST_CASE(mac_parser_accepts_unicast_and_refuses_multicast_zero_and_junk) {
  auto m = parse_mac("02:00:5e:10:00:01");
  BOOST_REQUIRE(m.ok());
  BOOST_TEST(format_mac(*m) == "02:00:5e:10:00:01");
  BOOST_TEST(parse_mac("02-00-5E-10-00-01").ok());
  BOOST_TEST(!parse_mac("01:00:5e:00:00:01").ok());  // multicast
  BOOST_TEST(parse_mac("01:00:5e:00:00:01", false).ok());
  BOOST_TEST(!parse_mac("00:00:00:00:00:00").ok());
  for (const char* bad : {"", "02:00:5e:10:00", "02:00:5e:10:00:01:02", "0g:00:5e:10:00:01", "02:00:5e:10:00:0",
                          "02.00.5e.10.00.01", "+2:00:5e:10:00:01"})
    BOOST_TEST(!parse_mac(bad).ok(), bad);
}

BOOST_AUTO_TEST_CASE(sysfs_ints_and_ids_are_range_checked) {
  BOOST_TEST(*parse_sysfs_int("-1\n", -1, 10) == -1);
  BOOST_TEST(*parse_sysfs_int("8", 0, 65535) == 8);
  BOOST_TEST(!parse_sysfs_int("65536", 0, 65535).ok());
  BOOST_TEST(!parse_sysfs_int("", 0, 1).ok());
  BOOST_TEST(!parse_sysfs_int("4x", 0, 10).ok());
  BOOST_TEST(!parse_sysfs_int("99999999999999999999999", 0, 10).ok());
  BOOST_TEST(*parse_pci_id("0x15b3\n") == 0x15b3);
  BOOST_TEST(*parse_pci_id("8086") == 0x8086);
  BOOST_TEST(!parse_pci_id("0x12345").ok());
  BOOST_TEST(!parse_pci_id("0x").ok());
}

BOOST_AUTO_TEST_CASE(rdma_node_types_and_gid_types_parse_like_the_kernel_prints_them) {
  BOOST_TEST((*parse_node_type("1: CA") == NodeType::ca));
  BOOST_TEST((*parse_node_type("4: RNIC\n") == NodeType::rnic));
  BOOST_TEST((*parse_node_type("9: FUTURE") == NodeType::unspecified));
  BOOST_TEST(!parse_node_type("CA").ok());
  BOOST_TEST(!parse_node_type(": CA").ok());
  BOOST_TEST((*parse_gid_type("IB/RoCE v1") == Transport::roce_v1));
  BOOST_TEST((*parse_gid_type("RoCE v2\n") == Transport::roce_v2));
  BOOST_TEST(!parse_gid_type("RoCE v3").has_value());
}

BOOST_AUTO_TEST_CASE(vf_config_validation_names_the_bad_field) {
  VfConfig c;
  BOOST_TEST(c.empty());
  BOOST_TEST(c.validate().ok());
  c.qos = 3;
  auto r = c.validate();
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().message.find("needs a VLAN id") != std::string::npos);
  c.vlan = 4095;
  BOOST_TEST(!c.validate().ok());
  c.vlan = 100;
  BOOST_TEST(c.validate().ok());
  c.qos = 8;
  BOOST_TEST(!c.validate().ok());
  c.qos = 0;
  c.min_tx_rate_mbps = 5000;
  c.max_tx_rate_mbps = 1000;
  BOOST_TEST(c.validate().error().message.find("exceeds the maximum") != std::string::npos);
  BOOST_TEST(!parse_vf_link_state("up").ok());
  BOOST_TEST((*parse_vf_link_state("disable") == VfLinkState::disable));
}
