#define BOOST_TEST_MODULE sriov_discovery
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "standard_host.hpp"
#include "vrdma/sriov/control.hpp"
#include "vrdma/sriov/discovery.hpp"

using namespace vrdma;
using namespace vrdma::sriov;
namespace fs = std::filesystem;

namespace {
struct Fixture : test::StandardHost {
  Inventory inv() {
    auto r = discover(sysfs);
    if (!r.ok()) BOOST_FAIL(r.error().message);
    return *r;
  }
};
PciAddress pci(const char* s) { return *parse_pci_address(s); }
bool has(const std::vector<Transport>& v, Transport t) { return std::find(v.begin(), v.end(), t) != v.end(); }
}  // namespace

BOOST_FIXTURE_TEST_CASE(finds_the_four_pfs_with_ids_drivers_numa_and_iommu_groups, Fixture) {
  auto i = inv();
  auto pfs = i.pfs();
  BOOST_REQUIRE_EQUAL(pfs.size(), 4U);
  const PciFunction* q = i.find(pci("0000:3b:00.0"));
  BOOST_REQUIRE(q);
  BOOST_TEST(q->vendor == 0x1077);
  BOOST_TEST(q->device == 0x8070);
  BOOST_TEST(q->model() == "QLogic FastLinQ QL41000");
  BOOST_TEST(q->driver == "qede");
  BOOST_TEST(q->total_vfs == 16U);
  BOOST_TEST(q->num_vfs == 0U);
  BOOST_TEST(q->iommu_group.value_or(-1) == 30);
  BOOST_TEST(q->numa_node == 0);
  BOOST_TEST(q->driver_override.empty());  // "(null)" in sysfs means none
  BOOST_REQUIRE_EQUAL(q->netdevs.size(), 1U);
  BOOST_TEST(q->netdevs[0] == "ens1f0");
  const PciFunction* cx = i.find(pci("0000:af:00.0"));
  BOOST_REQUIRE(cx);
  BOOST_TEST(cx->numa_node == 1);
  BOOST_TEST(cx->native_driver() == "mlx5_core");
}

BOOST_FIXTURE_TEST_CASE(maps_rdma_devices_with_link_layer_and_transports, Fixture) {
  auto i = inv();
  const PciFunction* roce = i.find(pci("0000:3b:00.0"));
  const PciFunction* iwarp = i.find(pci("0000:3b:00.1"));
  const PciFunction* e810 = i.find(pci("0000:5e:00.0"));
  BOOST_REQUIRE(roce && iwarp && e810);
  BOOST_REQUIRE_EQUAL(roce->rdma.size(), 1U);
  BOOST_TEST(roce->rdma[0].name == "qedr0");
  BOOST_REQUIRE_EQUAL(roce->rdma[0].ports.size(), 1U);
  BOOST_TEST(roce->rdma[0].ports[0].link_layer == "Ethernet");
  BOOST_TEST(has(roce->rdma[0].transports(), Transport::roce_v1));
  BOOST_TEST(has(roce->rdma[0].transports(), Transport::roce_v2));  // unreadable GID slot 2 is skipped
  BOOST_REQUIRE_EQUAL(iwarp->rdma.size(), 1U);
  BOOST_TEST((iwarp->rdma[0].node_type == NodeType::rnic));
  BOOST_TEST(has(iwarp->rdma[0].transports(), Transport::iwarp));
  BOOST_TEST(!has(iwarp->rdma[0].transports(), Transport::roce_v2));
  BOOST_TEST(e810->rdma.at(0).name == "irdma0");
}

BOOST_FIXTURE_TEST_CASE(vfs_written_through_sriov_numvfs_appear_with_physfn_and_index, Fixture) {
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 4).ok());
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:5e:00.0"), 2).ok());
  auto i = inv();
  auto vfs = i.vfs_of(pci("0000:af:00.0"));
  BOOST_REQUIRE_EQUAL(vfs.size(), 4U);
  BOOST_TEST(vfs[0]->addr.str() == "0000:af:00.2");  // offset 2, stride 1
  BOOST_TEST(vfs[3]->addr.str() == "0000:af:00.5");
  BOOST_TEST(vfs[2]->vf_index.value_or(99) == 2U);
  BOOST_TEST(vfs[0]->pf->str() == "0000:af:00.0");
  BOOST_TEST(vfs[0]->device == 0x1018);
  BOOST_TEST(vfs[0]->driver == "mlx5_core");
  BOOST_TEST(vfs[0]->iommu_group.has_value());
  BOOST_TEST((vfs[0]->iommu_group != vfs[1]->iommu_group));
  BOOST_REQUIRE_EQUAL(vfs[0]->rdma.size(), 1U);
  BOOST_TEST(vfs[0]->rdma[0].name == "mlx5_1");
  BOOST_TEST(i.find(pci("0000:af:00.0"))->num_vfs == 4U);
  auto e = i.vfs_of(pci("0000:5e:00.0"));
  BOOST_REQUIRE_EQUAL(e.size(), 2U);
  BOOST_TEST(e[0]->driver == "iavf");
  BOOST_TEST(e[0]->rdma.empty());  // iavf VFs carry no RDMA function
  BOOST_TEST(e[0]->netdevs.size() == 1U);
}

BOOST_FIXTURE_TEST_CASE(resolve_pf_accepts_address_or_netdev_and_explains_failures, Fixture) {
  auto i = inv();
  BOOST_TEST(resolve_pf(i, "ens3f0np0")->str() == "0000:af:00.0");
  BOOST_TEST(resolve_pf(i, "0000:3b:00.1")->str() == "0000:3b:00.1");
  auto missing = resolve_pf(i, "eth9");
  BOOST_REQUIRE(!missing.ok());
  BOOST_TEST(missing.error().message.find("no SR-IOV physical function 'eth9'") != std::string::npos);
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 1).ok());
  auto vf = resolve_pf(inv(), "0000:af:00.2");
  BOOST_REQUIRE(!vf.ok());
  BOOST_TEST(vf.error().message.find("is a VF") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(missing_sysfs_root_is_a_clear_error) {
  SysfsRoot s{"/nonexistent/vrdma-sys", std::chrono::milliseconds(10)};
  auto r = discover(s);
  BOOST_REQUIRE(!r.ok());
  BOOST_TEST(r.error().is(Errc::not_found));
  BOOST_TEST(r.error().message.find("--sysfs-root") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(garbage_attribute_values_do_not_break_discovery, Fixture) {
  // Semi-trusted input: a damaged numa_node or vendor id is skipped, not fatal.
  fs::path d = sim.root() / "bus/pci/devices/0000:3b:00.1";
  test::write_file(d / "numa_node", "banana");
  test::write_file(d / "vendor", "0xZZZZ");
  auto i = inv();
  const PciFunction* f = i.find(pci("0000:3b:00.1"));
  BOOST_REQUIRE(f);
  BOOST_TEST(f->numa_node == -1);
  BOOST_TEST(f->vendor == 0);
  // A PF whose VF count is unreadable is left out with a warning.
  test::write_file(d / "sriov_numvfs", "-3");
  BOOST_TEST(inv().find(pci("0000:3b:00.1")) == nullptr);
}
