#define BOOST_TEST_MODULE integration_transport
#include <boost/test/unit_test.hpp>

#include "vrdma/integration/migrate.hpp"

using namespace vrdma::integration;

namespace {
bool mentions(const TransportChoice& t, const std::string& s) {
  for (const auto& n : t.notes)
    if (n.find(s) != std::string::npos) return true;
  return false;
}
TransportFacts rdma_ready() {
  TransportFacts f;
  f.rdma_devices = {"mlx5_0"};
  f.hard_limit_set = true;
  f.memlock_limit = ~0ULL;
  f.guest_memory = 1ULL << 30;
  return f;
}
}  // namespace

BOOST_AUTO_TEST_CASE(uri_hosts) {
  BOOST_TEST(uri_host("qemu+tcp://10.99.9.2/system") == "10.99.9.2");
  BOOST_TEST(uri_host("qemu+ssh://root@hostb:22/system?keyfile=x") == "hostb");
  BOOST_TEST(uri_host("tcp://10.0.0.1:49152") == "10.0.0.1");
  BOOST_TEST(uri_host("rdma://[fe80::1]:4444") == "fe80::1");
  BOOST_TEST(uri_host("tcp:10.0.0.1:7811") == "10.0.0.1");
}

BOOST_AUTO_TEST_CASE(no_rdma_device_means_tcp_with_the_reason) {
  TransportFacts f;
  auto t = choose_transport("", "10.99.9.2", f);
  BOOST_TEST(!t.rdma);
  BOOST_TEST(t.migrate_uri == "tcp://10.99.9.2");
  BOOST_TEST(mentions(t, "no RDMA device"));
  auto given = choose_transport("tcp://10.99.9.2:49300", "x", f);
  BOOST_TEST(given.migrate_uri == "tcp://10.99.9.2:49300");
}

BOOST_AUTO_TEST_CASE(rdma_is_kept_when_every_check_passes) {
  auto t = choose_transport("rdma://10.0.0.2:4444", "b", rdma_ready());
  BOOST_TEST(t.rdma);
  BOOST_TEST(t.migrate_uri == "rdma://10.0.0.2:4444");
}

BOOST_AUTO_TEST_CASE(rdma_falls_back_to_tcp_naming_each_failed_check) {
  TransportFacts here;  // what this machine has: no device, no hard_limit, 8 MiB locked memory, no capability
  here.memlock_limit = 8ULL << 20;
  here.guest_memory = 256ULL << 20;
  auto t = choose_transport("rdma://10.99.9.2:4444", "b", here);
  BOOST_TEST(!t.rdma);
  BOOST_TEST(t.migrate_uri == "tcp://10.99.9.2:4444");
  BOOST_TEST(mentions(t, "no RDMA device"));
  BOOST_TEST(mentions(t, "hard_limit"));
  BOOST_TEST(mentions(t, "locked-memory limit is 8.0 MiB"));
  BOOST_TEST(mentions(t, "CAP_SYS_RESOURCE"));
  BOOST_TEST(mentions(t, "Falling back to TCP"));

  auto no_limit = rdma_ready();
  no_limit.hard_limit_set = false;
  auto t2 = choose_transport("rdma://h:1", "b", no_limit);
  BOOST_TEST(!t2.rdma);
  BOOST_TEST(mentions(t2, "hard_limit"));
  BOOST_TEST(!mentions(t2, "no RDMA device"));

  auto low = rdma_ready();
  low.memlock_limit = 8ULL << 20;
  BOOST_TEST(!choose_transport("rdma://h:1", "b", low).rdma);
  low.cap_sys_resource = true;  // libvirt can raise it for QEMU
  BOOST_TEST(choose_transport("rdma://h:1", "b", low).rdma);
}

BOOST_AUTO_TEST_CASE(rdma_needs_a_route_through_an_rdma_port) {
  auto f = rdma_ready();
  f.route_checked = true;
  f.gid_ifnames = {"ens1f0", "ens1f1"};
  f.route_ifname = "ens1f1";
  BOOST_TEST(choose_transport("rdma://10.0.0.2:4444", "b", f).rdma);
  f.route_ifname = "eno1";  // the management port
  auto t = choose_transport("rdma://10.0.0.2:4444", "b", f);
  BOOST_TEST(!t.rdma);
  BOOST_TEST(t.migrate_uri == "tcp://10.0.0.2:4444");
  BOOST_TEST(mentions(t, "the destination 10.0.0.2 is reached through eno1, which carries no RDMA GID (RDMA GIDs are "
                         "on ens1f0, ens1f1)"));
  f.route_ifname.clear();
  BOOST_TEST(mentions(choose_transport("rdma://10.0.0.2:4444", "b", f), "10.0.0.2 is not reachable from this host"));
  f.route_checked = false;  // the name did not resolve: nothing said about routes
  BOOST_TEST(choose_transport("rdma://hostb:4444", "b", f).rdma);
}

BOOST_AUTO_TEST_CASE(tcp_goes_multifd_unless_told_otherwise) {
  TransportFacts none;
  auto t = choose_transport("", "10.99.9.2", none);
  BOOST_TEST(t.parallel == kDefaultMultifdChannels);
  BOOST_TEST(mentions(t, "parallel TCP connections (multifd)"));
  BOOST_TEST(choose_transport("tcp://h:1", "h", none, 4).parallel == 4);
  auto one = choose_transport("tcp://h:1", "h", none, 1);
  BOOST_TEST(one.parallel == 0);
  BOOST_TEST(mentions(one, "one TCP stream"));
  // The RDMA fallback goes multifd too; RDMA itself is one connection, whatever --parallel says.
  BOOST_TEST(choose_transport("rdma://h:1", "h", none).parallel == kDefaultMultifdChannels);
  auto rdma = choose_transport("rdma://h:1", "h", rdma_ready(), 4);
  BOOST_TEST(rdma.rdma);
  BOOST_TEST(rdma.parallel == 0);
  BOOST_TEST(mentions(rdma, "--parallel is ignored"));
}

BOOST_AUTO_TEST_CASE(phase_sentences) {
  BOOST_TEST(phase_sentence("migrated").find("destination") != std::string::npos);
  BOOST_TEST(phase_sentence("failed").find("keeps running here") != std::string::npos);
  BOOST_TEST(phase_sentence("connecting").find("connecting to the destination") != std::string::npos);
  BOOST_TEST(phase_sentence("bogus").find("unknown") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_device_on_a_nic_is_said_to_lose_its_outside_peers_before_the_guest_moves) {
  BOOST_TEST(device_migration_note("g1", "soft:10.0.0.5").empty());
  BOOST_TEST(device_migration_note("g1", "soft:eth0").empty());
  for (const std::string engine : {"verbs:vf", "verbs:mlx5_0", "verbs:0000:3b:02.1"}) {
    const auto n = device_migration_note("g1", engine);
    BOOST_TEST(n.find("Domain g1's RDMA device runs on a NIC (engine " + engine + ")") != std::string::npos, n);
    BOOST_TEST(n.find("re-created on the destination's NIC under new numbers") != std::string::npos, n);
    BOOST_TEST(n.find("every RDMA peer outside the guest") != std::string::npos, n);
  }
}
