#define BOOST_TEST_MODULE sriov_control
#include <boost/test/unit_test.hpp>

#include <filesystem>

#include "standard_host.hpp"
#include "vrdma/sriov/control.hpp"

using namespace vrdma;
using namespace vrdma::sriov;
using vrdma::sriov::test::SriovSysfsSimulator;
namespace fs = std::filesystem;

namespace {
struct Fixture : test::StandardHost {
  std::string driver_of(const char* bdf) {
    std::error_code ec;
    auto t = fs::read_symlink(sim.root() / "bus/pci/devices" / bdf / "driver", ec);
    return ec ? "" : t.filename().string();
  }
};
PciAddress pci(const char* s) { return *parse_pci_address(s); }
bool mentions(const Status& s, const char* text) {
  return !s.ok() && s.error().message.find(text) != std::string::npos;
}
}  // namespace

BOOST_FIXTURE_TEST_CASE(enable_then_disable_creates_and_removes_vfs, Fixture) {
  auto pf = pci("0000:3b:00.0");
  BOOST_REQUIRE(set_num_vfs(sysfs, pf, 3).ok());
  BOOST_TEST(fs::exists(sim.root() / "bus/pci/devices/0000:3b:00.0/virtfn2"));
  BOOST_TEST(fs::exists(sim.root() / "class/infiniband/qedr_vf0"));
  BOOST_TEST(set_num_vfs(sysfs, pf, 3).ok());  // same count: nothing to do
  BOOST_REQUIRE(set_num_vfs(sysfs, pf, 0).ok());
  BOOST_TEST(!fs::exists(sim.root() / "bus/pci/devices/0000:3b:00.0/virtfn0"));
  BOOST_TEST(!fs::exists(sim.root() / "bus/pci/devices/0000:3b:00.2"));
}

BOOST_FIXTURE_TEST_CASE(changing_a_nonzero_count_is_refused_as_busy, Fixture) {
  auto pf = pci("0000:af:00.0");
  BOOST_REQUIRE(set_num_vfs(sysfs, pf, 2).ok());
  auto st = set_num_vfs(sysfs, pf, 4);
  BOOST_REQUIRE(!st.ok());
  BOOST_TEST(st.error().is(Errc::busy));
  BOOST_TEST(mentions(st, "already has 2 VFs enabled"));
  BOOST_TEST(mentions(st, "vrdmactl vf disable"));
}

BOOST_FIXTURE_TEST_CASE(more_vfs_than_totalvfs_and_non_pfs_are_rejected, Fixture) {
  auto st = set_num_vfs(sysfs, pci("0000:af:00.0"), 9);
  BOOST_TEST(st.error().is(Errc::invalid_argument));
  BOOST_TEST(mentions(st, "at most 8 VFs"));
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 1).ok());
  st = set_num_vfs(sysfs, pci("0000:af:00.2"), 1);
  BOOST_TEST(mentions(st, "is not an SR-IOV physical function"));
  st = set_num_vfs(sysfs, pci("0000:01:00.0"), 1);
  BOOST_TEST(st.error().is(Errc::not_found));
}

BOOST_FIXTURE_TEST_CASE(a_pf_without_its_driver_cannot_get_vfs, Fixture) {
  sim.unload_driver("ice");
  auto st = set_num_vfs(sysfs, pci("0000:5e:00.0"), 2);
  BOOST_TEST(st.error().is(Errc::bad_state));
  BOOST_TEST(mentions(st, "has no driver bound"));
  BOOST_TEST(mentions(st, "modprobe"));
}

BOOST_FIXTURE_TEST_CASE(vf_moves_to_vfio_pci_and_back_through_driver_override, Fixture) {
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 2).ok());
  auto vf = pci("0000:af:00.3");
  auto st = bind_driver(sysfs, vf, "vfio-pci");
  BOOST_TEST(st.error().is(Errc::not_found));
  BOOST_TEST(mentions(st, "modprobe vfio-pci"));
  sim.load_driver("vfio-pci");
  st = bind_driver(sysfs, vf, "vfio-pci");
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
  BOOST_TEST(driver_of("0000:af:00.3") == "vfio-pci");
  BOOST_TEST(!fs::exists(sim.root() / "class/infiniband/mlx5_2"));  // its RDMA function went with mlx5_core
  // VFs in use: disabling while one is on vfio-pci is refused.
  auto off = set_num_vfs(sysfs, pci("0000:af:00.0"), 0);
  BOOST_TEST(off.error().is(Errc::busy));
  BOOST_TEST(mentions(off, "VF 0000:af:00.3 of PF 0000:af:00.0 is bound to vfio-pci"));
  st = bind_native_driver(sysfs, vf);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
  BOOST_TEST(driver_of("0000:af:00.3") == "mlx5_core");
  BOOST_TEST(fs::exists(sim.root() / "class/infiniband/mlx5_2"));
  BOOST_TEST(set_num_vfs(sysfs, pci("0000:af:00.0"), 0).ok());
}

BOOST_FIXTURE_TEST_CASE(vfio_needs_an_iommu_group, Fixture) {
  sim.load_driver("vfio-pci");
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:3b:00.0"), 1).ok());
  sim.remove_iommu_group("0000:3b:00.2");
  auto st = bind_driver(sysfs, pci("0000:3b:00.2"), "vfio-pci");
  BOOST_TEST(st.error().is(Errc::bad_state));
  BOOST_TEST(mentions(st, "intel_iommu=on"));
}

BOOST_FIXTURE_TEST_CASE(missing_native_driver_is_named, Fixture) {
  sim.load_driver("vfio-pci");
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:5e:00.0"), 1).ok());
  BOOST_REQUIRE(bind_driver(sysfs, pci("0000:5e:01.0"), "vfio-pci").ok());
  sim.unload_driver("iavf");
  auto st = bind_native_driver(sysfs, pci("0000:5e:01.0"));
  BOOST_TEST(mentions(st, "driver iavf"));
  BOOST_TEST(mentions(st, "modprobe iavf"));
}

BOOST_AUTO_TEST_CASE(without_a_simulator_the_wait_times_out_with_a_sentence) {
  // A tree whose "kernel" never reacts: the write lands, the VFs never appear.
  SriovSysfsSimulator sim;  // not started
  sim.add_pf({"0000:3b:00.0", "0000:3a:00.0", 0x1077, 0x8070, 0x8090, "qede", "qede", 4, 2, 1, 0, 30, "ens1f0",
              "qedr0", test::SimRdma::roce, ""});
  SysfsRoot s{sim.root(), std::chrono::milliseconds(50)};
  auto st = set_num_vfs(s, pci("0000:3b:00.0"), 2);
  BOOST_TEST(st.error().is(Errc::timeout));
  BOOST_TEST(mentions(st, "accepted sriov_numvfs=2 but shows 0 VFs"));
}
