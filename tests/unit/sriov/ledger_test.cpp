#define BOOST_TEST_MODULE sriov_ledger
#include <boost/test/unit_test.hpp>
#include <sqlite3.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "standard_host.hpp"
#include "vrdma/sriov/control.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/pool.hpp"

using namespace vrdma;
using namespace vrdma::sriov;
namespace fs = std::filesystem;

namespace vrdma::sriov {
std::ostream& operator<<(std::ostream& o, const PciAddress& a) { return o << a.str(); }
}  // namespace vrdma::sriov

namespace {
PciAddress pci(const char* s) { return *parse_pci_address(s); }

struct Fixture : test::StandardHost {
  fs::path db;
  Fixture() {
    db = sim.root().parent_path() / "state/vf-ledger.sqlite";
    BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 4).ok());
    BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:5e:00.0"), 2).ok());
  }
  Ledger open() {
    auto l = Ledger::open(db);
    if (!l.ok()) BOOST_FAIL(l.error().message);
    return std::move(l).value();
  }
  Inventory inv() { return *discover(sysfs); }
};

AllocateRequest req(const char* owner, std::int64_t pid = 0, Purpose p = Purpose::guest) {
  return {p, owner, pid, current_boot_id()};
}
}  // namespace

BOOST_FIXTURE_TEST_CASE(ledger_uses_wal_and_records_schema_version, Fixture) {
  { auto l = open(); }
  sqlite3* raw = nullptr;
  BOOST_REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, nullptr);
  BOOST_REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  BOOST_TEST(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 0))) == "wal");
  sqlite3_finalize(st);
  sqlite3_prepare_v2(raw, "SELECT value FROM meta WHERE key='schema_version'", -1, &st, nullptr);
  BOOST_REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  BOOST_TEST(sqlite3_column_int(st, 0) == 1);
  sqlite3_finalize(st);
  sqlite3_close(raw);
}

BOOST_FIXTURE_TEST_CASE(pool_offers_only_vfs_with_an_rdma_function, Fixture) {
  std::vector<std::string> why;
  auto c = pool_candidates(inv(), PoolFilter{}, &why);
  BOOST_TEST(c.size() == 4U);  // the ConnectX-5 VFs; the E810's iavf VFs have no RDMA device
  BOOST_TEST(why.size() == 2U);
  BOOST_TEST(why[0].find("has no RDMA device (driver iavf)") != std::string::npos);
  PoolFilter pt;
  pt.need_rdma = false;
  BOOST_TEST(pool_candidates(inv(), pt).size() == 6U);
  PoolFilter numa;
  numa.numa_node = 0;
  BOOST_TEST(pool_candidates(inv(), numa).empty());
}

BOOST_FIXTURE_TEST_CASE(allocate_hands_out_distinct_vfs_and_release_returns_them, Fixture) {
  auto l = open();
  auto c = pool_candidates(inv(), PoolFilter{});
  auto a = l.allocate(req("vm1/rdma0"), c);
  auto b = l.allocate(req("vm2/rdma0"), c);
  auto m = l.allocate(req("mig-42", 0, Purpose::migration), c);
  BOOST_REQUIRE(a.ok() && b.ok() && m.ok());
  BOOST_TEST(a->vf != b->vf);
  BOOST_TEST(b->vf != m->vf);
  BOOST_TEST((a->state == AllocState::reserved));
  auto again = l.allocate(req("vm1/rdma0"), c);
  BOOST_REQUIRE(!again.ok());
  BOOST_TEST(again.error().is(Errc::busy));
  BOOST_TEST(again.error().message.find("already holds VF " + a->vf.str()) != std::string::npos);
  BOOST_REQUIRE(l.allocate(req("vm3/rdma0"), c).ok());
  auto full = l.allocate(req("vm4/rdma0"), c);
  BOOST_REQUIRE(!full.ok());
  BOOST_TEST(full.error().is(Errc::no_memory));
  BOOST_TEST(full.error().message.find("no free VF") != std::string::npos);
  auto wrong = l.release(a->vf, std::string("vm2/rdma0"));
  BOOST_TEST(wrong.error().is(Errc::access_denied));
  BOOST_TEST(l.release(a->vf, std::string("vm1/rdma0")).ok());
  BOOST_TEST(l.release(a->vf).error().is(Errc::not_found));
  auto re = l.allocate(req("vm4/rdma0"), c);
  BOOST_REQUIRE(re.ok());
  BOOST_TEST(re->vf == a->vf);
  BOOST_TEST(l.list()->size() == 4U);
}

BOOST_FIXTURE_TEST_CASE(allocations_survive_reopening, Fixture) {
  PciAddress vf;
  {
    auto l = open();
    auto a = l.allocate(req("vm1/rdma0"), pool_candidates(inv(), {}));
    BOOST_REQUIRE(a.ok());
    BOOST_REQUIRE(l.activate(a->vf, true).ok());
    vf = a->vf;
  }
  auto l = open();
  auto f = l.find_owner(Purpose::guest, "vm1/rdma0");
  BOOST_REQUIRE(f.ok() && f->has_value());
  BOOST_TEST((*f)->vf == vf);
  BOOST_TEST(((*f)->state == AllocState::active));
  BOOST_TEST((*f)->owner_pid == 0);
}

BOOST_FIXTURE_TEST_CASE(bad_owner_names_are_rejected, Fixture) {
  auto l = open();
  auto c = pool_candidates(inv(), {});
  for (std::string bad : {std::string(), std::string("vm 1"), std::string(200, 'x'), std::string("vm\n1")}) {
    auto a = l.allocate(req(bad.c_str()), c);
    BOOST_TEST(!a.ok());
    if (!a.ok()) BOOST_TEST(a.error().is(Errc::invalid_argument));
  }
}

BOOST_FIXTURE_TEST_CASE(reconcile_frees_dead_owners_vanished_vfs_and_unfinished_releases, Fixture) {
  auto l = open();
  auto c = pool_candidates(inv(), {});
  auto dead = l.allocate(req("vm-dead/rdma0", 999999), c);        // a pid that is not running
  auto live = l.allocate(req("vm-live/rdma0", getpid()), c);
  auto persistent = l.allocate(req("vm-cli/rdma0"), c);
  auto rel = l.allocate(req("vm-rel/rdma0"), c);
  BOOST_REQUIRE(dead.ok() && live.ok() && persistent.ok() && rel.ok());
  BOOST_REQUIRE(l.activate(persistent->vf, true).ok());
  BOOST_REQUIRE(l.activate(rel->vf, true).ok());
  BOOST_REQUIRE(l.mark_releasing(rel->vf).ok());
  ReconcileEnv env{current_boot_id(), [](std::int64_t pid) { return pid != 999999; }};
  auto acts = l.reconcile(inv(), env);
  BOOST_REQUIRE(acts.ok());
  BOOST_REQUIRE_EQUAL(acts->size(), 2U);
  auto left = *l.list();
  BOOST_REQUIRE_EQUAL(left.size(), 2U);
  BOOST_TEST(left[0].owner != "vm-dead/rdma0");
  bool saw_dead = false, saw_rel = false;
  for (const auto& a : *acts) {
    saw_dead |= a.kind == ReconcileAction::Kind::freed_dead_owner && a.sentence.find("which is gone") != std::string::npos;
    saw_rel |= a.kind == ReconcileAction::Kind::finished_release;
  }
  BOOST_TEST(saw_dead);
  BOOST_TEST(saw_rel);
  // The ledger disagrees with sysfs: the VFs are gone (disabled, or the host rebooted).
  BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 0).ok());
  acts = l.reconcile(inv(), env);
  BOOST_REQUIRE(acts.ok());
  BOOST_REQUIRE_EQUAL(acts->size(), 2U);
  BOOST_TEST((acts->at(0).kind == ReconcileAction::Kind::freed_missing_vf));
  BOOST_TEST(acts->at(0).sentence.find("no longer exists in sysfs") != std::string::npos);
  BOOST_TEST(l.list()->empty());
}

BOOST_FIXTURE_TEST_CASE(hand_over_passes_an_active_vf_to_the_process_that_uses_it, Fixture) {
  auto l = open();
  auto c = pool_candidates(inv(), {});
  auto a = l.allocate(req("g1@hv", getpid()), c);
  BOOST_REQUIRE(a.ok());
  // Only an active row of that owner can be handed over.
  auto reserved = l.hand_over(a->vf, "g1@hv", 999999);
  BOOST_REQUIRE(!reserved.ok());
  BOOST_TEST(reserved.error().is(Errc::bad_state));
  BOOST_REQUIRE(l.activate(a->vf, false).ok());
  auto other = l.hand_over(a->vf, "g2@hv", 999999);
  BOOST_REQUIRE(!other.ok());
  BOOST_TEST(other.error().message.find("is not held active by 'g2@hv'") != std::string::npos);
  BOOST_TEST(l.hand_over(a->vf, "g1@hv", -1).error().is(Errc::invalid_argument));
  BOOST_REQUIRE(l.hand_over(a->vf, "g1@hv", 999999).ok());
  BOOST_TEST(l.find(a->vf)->value().owner_pid == 999999);
  // Now the new holder's life decides: gone, the VF is freed although the allocator lives on.
  ReconcileEnv env{current_boot_id(), [](std::int64_t pid) { return pid != 999999; }};
  auto acts = l.reconcile(inv(), env);
  BOOST_REQUIRE(acts.ok());
  BOOST_REQUIRE_EQUAL(acts->size(), 1U);
  BOOST_TEST((acts->at(0).kind == ReconcileAction::Kind::freed_dead_owner));
  BOOST_TEST(l.list()->empty());
}

BOOST_AUTO_TEST_CASE(a_zombie_process_holds_no_vf) {
  BOOST_TEST(process_alive(getpid()));
  BOOST_TEST(!process_alive(0));
  const pid_t child = fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  // Not reaped yet: a zombie, which kill(pid, 0) still finds.
  for (int i = 0; i < 200 && process_alive(child); ++i) usleep(10000);
  BOOST_TEST(::kill(child, 0) == 0);
  BOOST_TEST(!process_alive(child));
  int st = 0;
  BOOST_REQUIRE(waitpid(child, &st, 0) == child);
  BOOST_TEST(!process_alive(child));
}

BOOST_FIXTURE_TEST_CASE(reconcile_after_reboot_frees_process_owned_rows_and_reports_untracked_vfio, Fixture) {
  auto l = open();
  auto c = pool_candidates(inv(), {});
  auto old = l.allocate({Purpose::guest, "vm-old/rdma0", getpid(), "boot-from-last-week"}, c);
  BOOST_REQUIRE(old.ok());
  sim.load_driver("vfio-pci");
  BOOST_REQUIRE(bind_driver(sysfs, pci("0000:5e:01.0"), "vfio-pci").ok());
  auto acts = l.reconcile(inv(), ReconcileEnv{"this-boot", {}});
  BOOST_REQUIRE(acts.ok());
  BOOST_REQUIRE_EQUAL(acts->size(), 2U);
  BOOST_TEST((acts->at(0).kind == ReconcileAction::Kind::freed_after_reboot));
  BOOST_TEST((acts->at(1).kind == ReconcileAction::Kind::untracked_vfio));
  BOOST_TEST(acts->at(1).sentence.find("left alone") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(a_damaged_row_is_reported_then_dropped_by_reconcile, Fixture) {
  { auto l = open(); }
  sqlite3* raw = nullptr;
  BOOST_REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  BOOST_REQUIRE(sqlite3_exec(raw,
                             "INSERT INTO allocations VALUES('not-a-bdf','0000:af:00.0',0,'guest','x',0,'',"
                             "'active',0)",
                             nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
  auto l = open();
  auto ls = l.list();
  BOOST_REQUIRE(!ls.ok());
  BOOST_TEST(ls.error().message.find("malformed") != std::string::npos);
  auto acts = l.reconcile(inv(), ReconcileEnv{current_boot_id(), {}});
  BOOST_REQUIRE(acts.ok());
  BOOST_TEST(acts->size() == 1U);
  BOOST_TEST(l.list()->empty());
}

BOOST_AUTO_TEST_CASE(a_file_that_is_not_a_ledger_is_refused) {
  auto p = fs::temp_directory_path() / ("vrdma-notledger-" + std::to_string(getpid()));
  {
    std::FILE* f = std::fopen(p.c_str(), "w");
    std::fputs("this is not sqlite, just text that is long enough to be a header..........\n", f);
    std::fclose(f);
  }
  auto l = Ledger::open(p);
  BOOST_REQUIRE(!l.ok());
  BOOST_TEST(l.error().message.find("not a vrdma ledger") != std::string::npos);
  fs::remove(p);
}

BOOST_FIXTURE_TEST_CASE(assign_rolls_back_the_reservation_when_configuration_fails, Fixture) {
  auto l = open();
  AssignOptions o;
  o.net.vlan = 100;  // the fixture's PF netdev does not exist in the kernel: rtnetlink fails
  auto a = assign_vf(sysfs, l, req("vm1/rdma0", getpid()), o);
  BOOST_REQUIRE(!a.ok());
  BOOST_TEST(a.error().message.find("no netdev named ens3f0np0") != std::string::npos);
  BOOST_TEST(l.list()->empty());
  // vfio-pci is not loaded: the bind fails and the row is rolled back as well.
  AssignOptions pt;
  pt.filter.need_rdma = false;
  pt.bind = BindMode::vfio;
  a = assign_vf(sysfs, l, req("vm1/rdma0", getpid()), pt);
  BOOST_REQUIRE(!a.ok());
  BOOST_TEST(a.error().message.find("modprobe vfio-pci") != std::string::npos);
  BOOST_TEST(l.list()->empty());
  sim.load_driver("vfio-pci");
  a = assign_vf(sysfs, l, req("vm1/rdma0", 0), pt);
  BOOST_REQUIRE_MESSAGE(a.ok(), (a.ok() ? std::string() : a.error().message));
  BOOST_TEST((a->state == AllocState::active));
  BOOST_TEST(discover(sysfs)->find(a->vf)->driver == "vfio-pci");
  BOOST_REQUIRE(release_vf(sysfs, l, a->vf, std::string("vm1/rdma0"), true).ok());
  BOOST_TEST(discover(sysfs)->find(a->vf)->driver != "vfio-pci");
  BOOST_TEST(l.list()->empty());
}
