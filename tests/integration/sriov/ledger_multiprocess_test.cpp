// The VF ledger shared by real processes: concurrent allocators (fork) never get the same VF,
// and a process killed mid-transaction or dying while holding a reservation is cleaned up.
#define BOOST_TEST_MODULE sriov_ledger_multiprocess
#include <boost/test/unit_test.hpp>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "sriov_sysfs_simulator.hpp"
#include "vrdma/sriov/control.hpp"
#include "vrdma/sriov/ledger.hpp"
#include "vrdma/sriov/pool.hpp"

using namespace vrdma;
using namespace vrdma::sriov;
namespace fs = std::filesystem;

namespace {
PciAddress pci(const char* s) { return *parse_pci_address(s); }

struct Fixture {
  test::SriovSysfsSimulator sim;
  SysfsRoot sysfs;
  fs::path db;
  std::vector<Candidate> cands;
  Fixture() {
    sim.add_standard_nics();
    sim.start();
    sysfs.root = sim.root();
    db = sim.root().parent_path() / "vf-ledger.sqlite";
    BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:af:00.0"), 8).ok());
    BOOST_REQUIRE(set_num_vfs(sysfs, pci("0000:3b:00.0"), 8).ok());
    cands = pool_candidates(*discover(sysfs), {});
    BOOST_REQUIRE_EQUAL(cands.size(), 16U);
    sim.stop();  // children are forked next; nothing below writes sysfs
    BOOST_REQUIRE(Ledger::open(db).ok());  // create the schema once, up front
  }
};

// Runs fn in a child; the child's exit status is fn's return value.
pid_t spawn(const std::function<int()>& fn) {
  pid_t p = fork();
  if (p == 0) _exit(fn());
  return p;
}

int wait_status(pid_t p) {
  int st = 0;
  waitpid(p, &st, 0);
  return st;
}
}  // namespace

BOOST_FIXTURE_TEST_CASE(concurrent_allocators_in_separate_processes_never_share_a_vf, Fixture) {
  constexpr int kProcs = 4, kEach = 6;  // 24 requests for 16 VFs
  int go[2], res[2];
  BOOST_REQUIRE(pipe(go) == 0 && pipe(res) == 0);
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(spawn([&, p]() -> int {
      close(go[1]);
      char c;
      if (read(go[0], &c, 1) != 1) return 3;  // start together
      auto l = Ledger::open(db);
      if (!l) return 4;
      for (int i = 0; i < kEach; ++i) {
        std::string owner = "vm" + std::to_string(p) + "/rdma" + std::to_string(i);
        auto a = l->allocate({Purpose::guest, owner, getpid(), current_boot_id()}, cands);
        std::string line = a ? a->vf.str() : (a.error().is(Errc::no_memory) ? "FULL" : "ERR " + a.error().message);
        line += "\n";
        if (write(res[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 5;
      }
      return 0;
    }));
  }
  close(go[0]);
  close(res[1]);
  for (int p = 0; p < kProcs; ++p) BOOST_REQUIRE(write(go[1], "g", 1) == 1);
  close(go[1]);
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = read(res[0], buf, sizeof buf)) > 0;) all.append(buf, static_cast<std::size_t>(n));
  close(res[0]);
  for (pid_t k : kids) BOOST_TEST(wait_status(k) == 0);
  std::multiset<std::string> got;
  int full = 0, errors = 0;
  std::size_t pos = 0;
  for (std::size_t nl; (nl = all.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    std::string line = all.substr(pos, nl - pos);
    if (line == "FULL") ++full;
    else if (line.rfind("ERR", 0) == 0) {
      ++errors;
      BOOST_TEST_MESSAGE(line);
    } else got.insert(line);
  }
  BOOST_TEST(errors == 0);
  BOOST_TEST(got.size() == 16U);
  BOOST_TEST(full == kProcs * kEach - 16);
  std::set<std::string> unique(got.begin(), got.end());
  BOOST_TEST(unique.size() == got.size());  // no VF handed out twice
  auto l = Ledger::open(db);
  BOOST_TEST(l->list()->size() == 16U);
}

BOOST_FIXTURE_TEST_CASE(a_process_killed_inside_a_write_transaction_leaves_no_trace_or_lock, Fixture) {
  int ready[2];
  BOOST_REQUIRE(pipe(ready) == 0);
  pid_t k = spawn([&]() -> int {
    sqlite3* raw = nullptr;
    if (sqlite3_open(db.c_str(), &raw) != SQLITE_OK) return 3;
    if (sqlite3_exec(raw, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) return 4;
    if (sqlite3_exec(raw,
                     "INSERT INTO allocations VALUES('0000:3b:00.2','0000:3b:00.0',0,'guest','half-done',1,'',"
                     "'reserved',0)",
                     nullptr, nullptr, nullptr) != SQLITE_OK)
      return 5;
    if (write(ready[1], "r", 1) != 1) return 6;
    pause();  // killed here, holding the write lock with an uncommitted row
    return 0;
  });
  close(ready[1]);
  char c;
  BOOST_REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  kill(k, SIGKILL);
  int st = wait_status(k);
  BOOST_TEST(WIFSIGNALED(st));
  auto l = Ledger::open(db);
  BOOST_REQUIRE(l.ok());
  BOOST_TEST(l->list()->empty());  // the uncommitted row is gone
  auto t0 = std::chrono::steady_clock::now();
  auto a = l->allocate({Purpose::guest, "vm1/rdma0", 0, current_boot_id()}, cands);
  BOOST_REQUIRE(a.ok());
  BOOST_TEST(a->vf.str() == "0000:3b:00.2");  // the first candidate: the killed row is gone
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)));  // no stale lock
}

BOOST_FIXTURE_TEST_CASE(a_backend_that_dies_holding_a_reservation_is_reconciled, Fixture) {
  pid_t k = spawn([&]() -> int {
    auto l = Ledger::open(db);
    if (!l) return 3;
    auto a = l->allocate({Purpose::guest, "vm-crash/rdma0", getpid(), current_boot_id()}, cands);
    return a ? 0 : 4;  // exits without activating or releasing: a crash between steps
  });
  BOOST_REQUIRE(wait_status(k) == 0);
  auto l = Ledger::open(db);
  auto held = l->find_owner(Purpose::guest, "vm-crash/rdma0");
  BOOST_REQUIRE(held.ok() && held->has_value());
  BOOST_TEST((*held)->owner_pid == k);
  auto acts = l->reconcile(*discover(sysfs), ReconcileEnv{current_boot_id(), {}});  // real kill(pid, 0)
  BOOST_REQUIRE(acts.ok());
  BOOST_REQUIRE_EQUAL(acts->size(), 1U);
  BOOST_TEST((acts->at(0).kind == ReconcileAction::Kind::freed_dead_owner));
  BOOST_TEST(l->list()->empty());
}

BOOST_FIXTURE_TEST_CASE(killing_allocators_at_random_moments_keeps_the_ledger_consistent, Fixture) {
  // Children allocate and release in a loop; each is SIGKILLed at a different moment.
  for (int round = 0; round < 6; ++round) {
    pid_t k = spawn([&, round]() -> int {
      auto l = Ledger::open(db);
      if (!l) return 3;
      for (int i = 0;; ++i) {
        std::string owner = "churn" + std::to_string(round) + "-" + std::to_string(i % 4);
        auto a = l->allocate({Purpose::migration, owner, getpid(), current_boot_id()}, cands);
        if (a) (void)l->release(a->vf);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(15 + round * 17));
    kill(k, SIGKILL);
    wait_status(k);
  }
  sqlite3* raw = nullptr;
  BOOST_REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(raw, "PRAGMA integrity_check", -1, &st, nullptr);
  BOOST_REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  BOOST_TEST(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 0))) == "ok");
  sqlite3_finalize(st);
  sqlite3_close(raw);
  auto l = Ledger::open(db);
  auto rows = l->list();
  BOOST_REQUIRE(rows.ok());  // every row parses
  BOOST_TEST(rows->size() <= 6U);  // at most the one in flight per killed child
  auto acts = l->reconcile(*discover(sysfs), ReconcileEnv{current_boot_id(), {}});
  BOOST_REQUIRE(acts.ok());
  BOOST_TEST(l->list()->empty());  // their owners are dead: all freed
}
