// The verbs provider without an RDMA NIC: PCI function -> ibdev resolution against the SR-IOV
// sysfs fixture (VFs created through the sriov module's own set_num_vfs), discovery on a host
// without the RDMA stack, the connection manager's answer when there is none, and the reading
// of a UD sender's GRH (untrusted bytes).
#define BOOST_TEST_MODULE verbs_provider
#include <stdlib.h>

#include <array>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <filesystem>

#include "check.hpp"
#include "standard_host.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/nicdrv/verbs.hpp"
#include "vrdma/sriov/control.hpp"
#include "vrdma/sriov/discovery.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
namespace fs = std::filesystem;

namespace {

struct SysfsFixture : sriov::test::StandardHost {
  void enable_vfs(const char* pf, std::uint32_t n) {
    auto st = sriov::set_num_vfs(sysfs, *sriov::parse_pci_address(pf), n);
    VRDMA_REQUIRE_OK(st);
  }
};

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

bool host_has_rdma_devices() {
  std::error_code ec;
  return fs::exists("/sys/class/infiniband", ec) && !fs::is_empty("/sys/class/infiniband", ec);
}

}  // namespace

BOOST_AUTO_TEST_CASE(pci_addresses_are_recognised_by_shape) {
  BOOST_TEST(verbs::is_pci_address("0000:3b:02.1"));
  BOOST_TEST(verbs::is_pci_address("0000:AF:00.7"));
  BOOST_TEST(!verbs::is_pci_address("mlx5_0"));
  BOOST_TEST(!verbs::is_pci_address("3b:02.1"));
  BOOST_TEST(!verbs::is_pci_address("0000:3b:02:1"));
  BOOST_TEST(!verbs::is_pci_address("0000:3g:02.1"));
  BOOST_TEST(!verbs::is_pci_address(""));
}

BOOST_FIXTURE_TEST_CASE(a_vf_pci_address_resolves_to_its_rdma_device, SysfsFixture) {
  enable_vfs("0000:af:00.0", 2);
  auto pf = verbs::ibdev_for_pci(sim.root(), "0000:af:00.0");
  VRDMA_REQUIRE_OK(pf);
  BOOST_TEST(*pf == "mlx5_0");
  // The first VF is at the PF's routing ID + offset 2 (the fixture's ConnectX-5).
  auto vf = verbs::ibdev_for_pci(sim.root(), "0000:af:00.2");
  VRDMA_REQUIRE_OK(vf);
  BOOST_TEST(*vf == "mlx5_1");
  auto vf2 = verbs::ibdev_for_pci(sim.root(), "0000:AF:00.3");  // case does not matter
  BOOST_REQUIRE(vf2.ok());
  BOOST_TEST(*vf2 == "mlx5_2");
  // The iWARP port of the QL41000 and the RoCE port are separate functions with their own ibdev.
  BOOST_TEST(*verbs::ibdev_for_pci(sim.root(), "0000:3b:00.1") == "qedr1");
}

BOOST_FIXTURE_TEST_CASE(functions_without_rdma_and_missing_functions_are_explained, SysfsFixture) {
  enable_vfs("0000:5e:00.0", 1);  // E810: iavf VFs have no RDMA function
  auto iavf = verbs::ibdev_for_pci(sim.root(), "0000:5e:01.0");  // VF 0: routing ID + offset 8
  BOOST_REQUIRE(!iavf.ok());
  BOOST_TEST(iavf.error().is(Errc::not_found));
  BOOST_TEST(contains(iavf.error().message, "has no RDMA device"), iavf.error().message);
  auto gone = verbs::ibdev_for_pci(sim.root(), "0000:af:00.6");  // VFs not enabled
  BOOST_REQUIRE(!gone.ok());
  BOOST_TEST(gone.error().is(Errc::not_found));
  BOOST_TEST(contains(gone.error().message, "does not exist"));
  auto bad = verbs::ibdev_for_pci(sim.root(), "af:00.6");
  BOOST_REQUIRE(!bad.ok());
  BOOST_TEST(bad.error().is(Errc::invalid_argument));
  BOOST_TEST(contains(bad.error().message, "DDDD:BB:DD.F"));
}

BOOST_FIXTURE_TEST_CASE(open_device_resolves_a_pci_name_through_the_given_sysfs_root, SysfsFixture) {
  enable_vfs("0000:af:00.0", 1);
  auto r = open_device("verbs:0000:af:00.2?sysfs_root=" + sim.root().string());
  if (r.ok()) {
    BOOST_TEST_MESSAGE("SKIP: this host has a real RDMA device named mlx5_1");
    return;
  }
  BOOST_TEST(r.error().is(Errc::no_device));
  BOOST_TEST(contains(r.error().message, "mlx5_1"));  // resolved through the fixture, then looked up
  // The environment variable is the default root.
  ::setenv("VRDMA_SYSFS_ROOT", sim.root().c_str(), 1);
  auto e = open_device("verbs:0000:5e:00.0");
  ::unsetenv("VRDMA_SYSFS_ROOT");
  BOOST_REQUIRE(!e.ok());
  BOOST_TEST(contains(e.error().message, "irdma0"));
  // A function without an RDMA device is no device, with the reason.
  auto none = open_device("verbs:0000:5e:00.7?sysfs_root=" + sim.root().string());
  BOOST_REQUIRE(!none.ok());
  BOOST_TEST(none.error().is(Errc::no_device));
  BOOST_TEST(contains(none.error().message, "does not exist"));
}

BOOST_AUTO_TEST_CASE(a_host_without_rdma_devices_discovers_none_cleanly) {
  if (host_has_rdma_devices()) {
    BOOST_TEST_MESSAGE("SKIP: this host has RDMA devices; the no-device answers cannot be checked");
    return;
  }
  BOOST_TEST(verbs::list().empty());
  for (const auto& d : list_devices()) BOOST_TEST(d.provider != "verbs");
  auto r = open_device("verbs:x");
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().is(Errc::no_device));
  BOOST_TEST(contains(r.error().message, "'x'"));
  BOOST_TEST(contains(r.error().message, "no RDMA devices"));
  auto empty = open_device("verbs:");
  BOOST_REQUIRE(!empty.ok());
  BOOST_TEST(empty.error().is(Errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(the_connection_manager_says_why_it_cannot_connect) {
  auto bad = verbs::cm_resolve("not-an-address", 1);
  BOOST_REQUIRE(!bad.ok());
  BOOST_TEST(bad.error().is(Errc::invalid_argument));
  if (host_has_rdma_devices()) {
    BOOST_TEST_MESSAGE("SKIP: this host has RDMA devices; the no-CM answer cannot be checked");
    return;
  }
  // No RDMA device routes to loopback here: the CM is absent or resolution fails, in a sentence.
  verbs::CmParams params;
  params.timeout = std::chrono::milliseconds(500);
  auto r = verbs::cm_resolve("127.0.0.1", 18515, {}, params);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(!r.error().message.empty());
  BOOST_TEST_MESSAGE("cm_resolve: " << r.error().message);
  auto l = verbs::cm_listen("127.0.0.1", 0);
  if (!l.ok()) BOOST_TEST(!l.error().message.empty());
}

// ---- the sender of a UD message, read from the 40 bytes before its payload ---------------------
namespace {
std::array<std::uint8_t, 40> ipv4_grh(const std::uint8_t src[4], bool valid_checksum, std::uint8_t first = 0) {
  std::array<std::uint8_t, 40> g{};
  g[0] = first;
  std::uint8_t* h = g.data() + 20;  // RoCE v2 over IPv4: the IPv4 header in the last 20 bytes
  const std::uint8_t hdr[20] = {0x45, 0, 0, 92, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, src[0], src[1], src[2], src[3], 10, 92, 0, 2};
  std::memcpy(h, hdr, 20);
  std::uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += static_cast<std::uint32_t>(h[i] << 8 | h[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  const auto c = static_cast<std::uint16_t>(~sum);
  h[10] = static_cast<std::uint8_t>(c >> 8);
  h[11] = static_cast<std::uint8_t>(valid_checksum ? c : c ^ 1);
  return g;
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_sender_of_a_ud_message_is_read_from_its_grh) {
  const std::uint8_t src[4] = {10, 92, 0, 7};
  // RoCE v2 over IPv4 (rxe, mlx5): the IPv4 source as a mapped GID; rxe's own loopback leaves
  // the checksum 0, so outside a GRH the checksum is not required.
  for (bool ok : {true, false}) {
    auto g = verbs::grh_source(ipv4_grh(src, ok));
    BOOST_REQUIRE(g.has_value());
    BOOST_TEST(g->str() == "::ffff:10.92.0.7");
  }
  // An IB GRH / RoCE v2 over IPv6: the SGID at byte 8.
  std::array<std::uint8_t, 40> ib{};
  ib[0] = 0x60;
  const std::uint8_t sgid[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x92, 0, 2};
  std::memcpy(ib.data() + 8, sgid, 16);
  auto g6 = verbs::grh_source(ib);
  BOOST_REQUIRE(g6.has_value());
  BOOST_TEST(std::memcmp(g6->raw.data(), sgid, 16) == 0);
  // A GRH whose bytes 20.. look like an IPv4 header is a GRH unless the checksum holds.
  auto both = ipv4_grh(src, false, 0x60);
  std::memcpy(both.data() + 8, sgid, 12);  // SGID bytes 8..19; 20..23 belong to the "IPv4" part
  auto gg = verbs::grh_source(both);
  BOOST_REQUIRE(gg.has_value());
  BOOST_TEST(!gg->is_ipv4_mapped());
  auto both_ok = verbs::grh_source(ipv4_grh(src, true, 0x60));
  BOOST_REQUIRE(both_ok.has_value());
  BOOST_TEST(both_ok->str() == "::ffff:10.92.0.7");
  // Bad input: zeros, IPv4 with options, another IP version: no sender, no guess.
  BOOST_TEST(!verbs::grh_source(std::array<std::uint8_t, 40>{}).has_value());
  auto opts = ipv4_grh(src, true);
  opts[20] = 0x46;
  BOOST_TEST(!verbs::grh_source(opts).has_value());
  auto v5 = ipv4_grh(src, true, 0x50);
  v5[20] = 0x55;
  BOOST_TEST(!verbs::grh_source(v5).has_value());
}
