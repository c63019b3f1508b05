// The pure parts of the hook's VF handling (guest_vf.hpp): ledger owner names, the VF settings an
// element asks for and their reset, and the vrdmad arguments for a VF. The flow itself (ledger,
// sysfs, backend) is integration_hook_vf_test. Also the migration VF's settings (migration_vf.hpp):
// how they are read from the environment and /etc/default/vrdma, checked, and the MAC it gets.
#define BOOST_TEST_MODULE integration_guest_vf
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "vrdma/integration/guest_vf.hpp"
#include "vrdma/integration/migration_vf.hpp"
#include "vrdma/sriov/pool.hpp"

using namespace vrdma;
using namespace vrdma::integration;

namespace {
DeviceMeta vf_device() {
  DeviceMeta m;
  m.socket = "/run/vrdma/g1.sock";
  m.engine = "verbs:vf";
  m.vf = VfRequest{};
  return m;
}
}  // namespace

BOOST_AUTO_TEST_CASE(owner_names_are_domain_at_host_and_fit_the_ledger) {
  BOOST_TEST(vf_owner("g1", "hv-a") == "g1@hv-a");
  BOOST_TEST(vf_owner("my guest", "hv-a") == "my_guest@hv-a");
  BOOST_TEST(vf_owner(std::string(300, 'x'), "h").size() == 96U + 2U);
  BOOST_TEST(vf_owner("", "h") == "_@h");
}

BOOST_AUTO_TEST_CASE(the_vf_settings_come_from_the_element_and_reset_to_a_fresh_vf) {
  auto m = vf_device();
  auto none = vf_config_for(m);
  BOOST_REQUIRE(none.ok());
  BOOST_TEST(none->empty());  // nothing asked: no netlink needed
  m.mac = "52:54:00:12:34:56";
  m.vf->vlan = 42;
  m.vf->max_rate_mbps = 10000;
  m.vf->trust = true;
  m.vf->spoofchk = false;
  auto c = vf_config_for(m);
  BOOST_REQUIRE(c.ok());
  BOOST_TEST(sriov::format_mac(c->mac.value()) == "52:54:00:12:34:56");
  BOOST_TEST(c->vlan.value() == 42);
  BOOST_TEST(c->max_tx_rate_mbps.value() == 10000U);
  BOOST_TEST(c->trust.value());
  BOOST_TEST(!c->spoofchk.value());
  const auto r = sriov::clean_vf_config(*c);
  BOOST_TEST(sriov::format_mac(r.mac.value()) == "00:00:00:00:00:00");
  BOOST_TEST(r.vlan.value() == 0);
  BOOST_TEST(r.max_tx_rate_mbps.value() == 0U);
  BOOST_TEST(!r.trust.value());
  BOOST_TEST(r.spoofchk.value());
  BOOST_TEST(!r.min_tx_rate_mbps.has_value());  // not asked, not touched
  BOOST_TEST(!r.link_state.has_value());
  BOOST_TEST(r.validate().ok());
  m.mac = "01:00:5e:00:00:01";
  auto multicast = vf_config_for(m);
  BOOST_REQUIRE(!multicast.ok());
  BOOST_TEST(multicast.error().message.find("the device's mac cannot be a VF's MAC") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(vrdmad_runs_on_the_vf_s_rdma_device_with_the_guest_s_mac) {
  auto m = vf_device();
  GuestVf vf{"0000:3b:00.2", "0000:3b:00.0", 0, "qedr_vf0", "02:5e:3b:02:00:00", "g1@h", false};
  auto b = backend_for_vf(m, vf);
  BOOST_TEST(b.engine == "verbs:qedr_vf0");
  BOOST_TEST(b.mac == "02:5e:3b:02:00:00");  // no mac in the element: the VF's own
  BOOST_TEST(b.socket == m.socket);
  m.engine = "verbs:vf?gid_index=3";
  m.mac = "52:54:00:12:34:56";
  b = backend_for_vf(m, vf);
  BOOST_TEST(b.engine == "verbs:qedr_vf0?gid_index=3");
  BOOST_TEST(b.mac == "52:54:00:12:34:56");
}

namespace {
// A defaults file of the test's own, with the migration settings taken out of the environment.
struct Defaults {
  std::filesystem::path file = std::filesystem::temp_directory_path() / ("vrdma-defaults-" + std::to_string(::getpid()));
  explicit Defaults(const std::string& text) {
    std::ofstream(file) << text;
    ::setenv("VRDMA_DEFAULTS", file.c_str(), 1);
    ::unsetenv("VRDMA_MIGRATION_POOL");
    ::unsetenv("VRDMA_MIGRATION_ADDRESS");
  }
  ~Defaults() {
    std::filesystem::remove(file);
    ::unsetenv("VRDMA_DEFAULTS");
    ::unsetenv("VRDMA_MIGRATION_POOL");
    ::unsetenv("VRDMA_MIGRATION_ADDRESS");
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(host_settings_come_from_the_environment_else_the_defaults_file_as_the_shell_reads_it) {
  Defaults d("# VRDMA_MIGRATION_POOL=commented\nVRDMA_MIGRATION_POOL=ens1f0\n  export VRDMA_MIGRATION_ADDRESS=\"10.77.0.1/24\"\n"
             "VRDMA_MIGRATION_POOLX=no\nVRDMA_VF_LEDGER='/tmp/a b'\nVRDMA_VF_LEDGER='/tmp/l.sqlite'\n");
  BOOST_TEST(host_setting("VRDMA_MIGRATION_POOL") == "ens1f0");
  BOOST_TEST(host_setting("VRDMA_MIGRATION_ADDRESS") == "10.77.0.1/24");
  BOOST_TEST(host_setting("VRDMA_VF_LEDGER") == "/tmp/l.sqlite");  // the last one, as when sourced
  BOOST_TEST(host_setting("VRDMA_NOT_THERE").empty());
  BOOST_TEST(VfPaths::from_environment().ledger == "/tmp/l.sqlite");
  ::setenv("VRDMA_MIGRATION_POOL", "ens9f0", 1);
  BOOST_TEST(host_setting("VRDMA_MIGRATION_POOL") == "ens9f0");  // the environment wins
  auto n = MigrationNet::from_host_settings();
  BOOST_REQUIRE(n.ok());
  BOOST_REQUIRE(n->has_value());
  BOOST_TEST((*n)->pool == "ens9f0");
  BOOST_TEST((*n)->address == "10.77.0.1/24");
}

BOOST_AUTO_TEST_CASE(migration_settings_are_both_or_none_and_the_address_has_a_prefix) {
  {
    Defaults d("");
    auto n = MigrationNet::from_host_settings();
    BOOST_REQUIRE(n.ok());
    BOOST_TEST(!n->has_value());
  }
  auto error_of = [](const std::string& text) {
    Defaults d(text);
    auto n = MigrationNet::from_host_settings();
    return n.ok() ? std::string("accepted") : n.error().message;
  };
  BOOST_TEST(error_of("VRDMA_MIGRATION_POOL=ens1f0\n").find("VRDMA_MIGRATION_POOL is set but VRDMA_MIGRATION_ADDRESS "
                                                           "is not") == 0);
  BOOST_TEST(error_of("VRDMA_MIGRATION_ADDRESS=10.0.0.1/24\n").find("VRDMA_MIGRATION_ADDRESS is set but "
                                                                    "VRDMA_MIGRATION_POOL is not") == 0);
  for (const char* bad : {"10.0.0.1", "10.0.0.1/", "10.0.0.1/33", "10.0.0.1/0", "10.0.0.256/24", "fd00::1/129",
                          "host/24", "10.0.0.1/2x", "10.0.0.1/0024"}) {
    const auto e = error_of(std::string("VRDMA_MIGRATION_POOL=p\nVRDMA_MIGRATION_ADDRESS=") + bad + "\n");
    BOOST_TEST(e.find("is not an address with its prefix length") != std::string::npos, bad << ": " << e);
  }
  for (const char* good : {"10.0.0.1/24", "10.0.0.1/32", "fd00:77::11/64", "fd00::1/128"})
    BOOST_TEST(error_of(std::string("VRDMA_MIGRATION_POOL=p\nVRDMA_MIGRATION_ADDRESS=") + good + "\n") == "accepted",
               good);
}

BOOST_AUTO_TEST_CASE(a_migration_vf_without_a_mac_gets_one_from_its_address_and_its_owner_names_the_host) {
  BOOST_TEST(migration_vf_mac("10.77.0.11/24") == "02:76:6d:4d:00:0b");
  BOOST_TEST(migration_vf_mac("10.77.1.12/24") == "02:76:6d:4d:01:0c");
  BOOST_TEST(migration_vf_mac("fd00:77::1:2:3/64") == "02:76:6d:02:00:03");
  BOOST_TEST(migration_vf_owner("hv-a") == "migration@hv-a");
  BOOST_TEST(migration_vf_owner("h v") == "migration@h_v");
}
