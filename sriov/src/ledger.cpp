#include "vrdma/sriov/ledger.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <ctime>
#include <set>

#include "sqlite_util.hpp"
#include "sysfs_io.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::sriov {
namespace fs = std::filesystem;
using detail::exec;
using detail::sqlite_error;
using detail::Stmt;
using detail::Txn;

namespace {

constexpr int kSchemaVersion = 1;

// Schema: docs/sriov.md ("Ledger"). The vf primary key is what makes double allocation
// impossible; UNIQUE(purpose, owner) gives every backend device (or migration) one VF.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS allocations(
  vf           TEXT PRIMARY KEY,
  pf           TEXT NOT NULL,
  vf_index     INTEGER NOT NULL CHECK (vf_index >= 0),
  purpose      TEXT NOT NULL CHECK (purpose IN ('guest', 'migration')),
  owner        TEXT NOT NULL CHECK (length(owner) BETWEEN 1 AND 128),
  owner_pid    INTEGER NOT NULL DEFAULT 0,
  boot_id      TEXT NOT NULL DEFAULT '',
  state        TEXT NOT NULL CHECK (state IN ('reserved', 'active', 'releasing')),
  allocated_at INTEGER NOT NULL,
  UNIQUE (purpose, owner));
CREATE TABLE IF NOT EXISTS events(
  id     INTEGER PRIMARY KEY AUTOINCREMENT,
  at     INTEGER NOT NULL,
  vf     TEXT NOT NULL,
  event  TEXT NOT NULL,
  detail TEXT NOT NULL);
)sql";

constexpr const char* kColumns = "vf, pf, vf_index, purpose, owner, owner_pid, boot_id, state, allocated_at";

std::int64_t now() { return static_cast<std::int64_t>(std::time(nullptr)); }

Result<AllocState> parse_state(std::string_view s) {
  if (s == "reserved") return AllocState::reserved;
  if (s == "active") return AllocState::active;
  if (s == "releasing") return AllocState::releasing;
  return make_error(Errc::bad_state, fmt::format("unknown allocation state '{}'", s.substr(0, 32)));
}

// Rows are semi-trusted (another version, a hand edit, a damaged file): parse every column.
Result<Allocation> row_to_allocation(const Stmt& st) {
  Allocation a;
  std::string vf = st.text(0);
  auto v = parse_pci_address(vf);
  auto p = parse_pci_address(st.text(1));
  auto pu = parse_purpose(st.text(3));
  auto s = parse_state(st.text(7));
  if (!v || !p || !pu || !s || st.i64(2) < 0 || st.i64(2) > 65535)
    return make_error(Errc::bad_state, fmt::format("the ledger row for VF '{}' is malformed; run 'vrdmactl vf "
                                                   "reconcile' to drop it",
                                                   vf.substr(0, 40)));
  a.vf = *v;
  a.pf = *p;
  a.vf_index = static_cast<std::uint32_t>(st.i64(2));
  a.purpose = *pu;
  a.owner = st.text(4);
  a.owner_pid = st.i64(5);
  a.boot_id = st.text(6);
  a.state = *s;
  a.allocated_at = st.i64(8);
  return a;
}

Status check_owner(std::string_view owner) {
  if (owner.empty() || owner.size() > 128)
    return make_error(Errc::invalid_argument, "an owner name must be 1 to 128 characters long");
  for (char c : owner) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7e)
      return make_error(Errc::invalid_argument,
                        "an owner name may contain only printable ASCII without spaces (for example vm1/rdma0)");
  }
  return {};
}

std::string describe(const Allocation& a) {
  return fmt::format("{} '{}'", purpose_name(a.purpose), a.owner);
}

}  // namespace

bool process_alive(std::int64_t pid) {
  if (pid <= 0 || pid > 0x3fffffff) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  // A zombie holds nothing any more; its state letter follows the ')' closing its name.
  const auto stat = detail::read_attr(fmt::format("/proc/{}/stat", pid));
  if (!stat) return true;  // no /proc: trust kill()
  const auto close = stat->rfind(')');
  return close == std::string::npos || close + 2 >= stat->size() || (*stat)[close + 2] != 'Z';
}

std::string_view purpose_name(Purpose p) { return p == Purpose::guest ? "guest" : "migration"; }

Result<Purpose> parse_purpose(std::string_view s) {
  if (s == "guest") return Purpose::guest;
  if (s == "migration") return Purpose::migration;
  return make_error(Errc::invalid_argument, fmt::format("'{}' is not a purpose; use guest or migration", s.substr(0, 32)));
}

std::string_view alloc_state_name(AllocState s) {
  switch (s) {
    case AllocState::reserved: return "reserved";
    case AllocState::active: return "active";
    case AllocState::releasing: return "releasing";
  }
  return "?";
}

std::string current_boot_id() {
  auto b = detail::read_attr("/proc/sys/kernel/random/boot_id");
  return b ? *b : std::string();
}

struct Ledger::Impl {
  fs::path path;
  detail::DbPtr db;

  Status event(const std::string& vf, std::string_view what, const std::string& detail) {
    Stmt st(db.get(), "INSERT INTO events(at, vf, event, detail) VALUES(?, ?, ?, ?)");
    if (!st.ok()) return sqlite_error(db.get(), st.prepare_rc(), "cannot record a ledger event");
    st.bind(1, now()).bind(2, vf).bind(3, what).bind(4, detail);
    int rc = st.step();
    if (rc != SQLITE_DONE) return sqlite_error(db.get(), rc, "cannot record a ledger event");
    return {};
  }

  Status remove(const std::string& vf) {
    Stmt st(db.get(), "DELETE FROM allocations WHERE vf = ?");
    if (!st.ok()) return sqlite_error(db.get(), st.prepare_rc(), "cannot prepare a ledger delete");
    st.bind(1, vf);
    int rc = st.step();
    if (rc != SQLITE_DONE) return sqlite_error(db.get(), rc, fmt::format("cannot remove VF {} from the ledger", vf));
    return {};
  }

  Result<std::optional<Allocation>> query_one(const std::string& where, const std::vector<std::string>& args) {
    Stmt st(db.get(), fmt::format("SELECT {} FROM allocations WHERE {}", kColumns, where));
    if (!st.ok()) return sqlite_error(db.get(), st.prepare_rc(), "cannot query the VF ledger");
    for (std::size_t i = 0; i < args.size(); ++i) st.bind(static_cast<int>(i + 1), args[i]);
    int rc = st.step();
    if (rc == SQLITE_DONE) return std::optional<Allocation>();
    if (rc != SQLITE_ROW) return sqlite_error(db.get(), rc, "cannot query the VF ledger");
    auto a = row_to_allocation(st);
    if (!a) return std::move(a).error();
    return std::optional<Allocation>(std::move(*a));
  }
};

Ledger::Ledger(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Ledger::Ledger(Ledger&&) noexcept = default;
Ledger& Ledger::operator=(Ledger&&) noexcept = default;
Ledger::~Ledger() = default;
const fs::path& Ledger::path() const { return impl_->path; }

Result<Ledger> Ledger::open(const fs::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec)
    return make_error(Errc::io_error, fmt::format("cannot create the directory for the VF ledger {}: {}", path.string(),
                                                  ec.message()));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  impl->db.reset(raw);
  if (rc != SQLITE_OK) return sqlite_error(raw, rc, fmt::format("cannot open the VF ledger {}", path.string()));
  sqlite3* db = impl->db.get();
  sqlite3_busy_timeout(db, 10000);
  sqlite3_extended_result_codes(db, 1);
  // WAL: readers never block the writer; synchronous=FULL: a committed allocation survives power loss.
  // Switching a fresh file to WAL takes an exclusive lock and SQLite may answer SQLITE_BUSY without
  // calling the busy handler when another process is doing the same: retry for up to 10 s.
  for (int attempt = 0;; ++attempt) {
    auto wal = exec(db, "PRAGMA journal_mode=WAL", fmt::format("cannot use the VF ledger {}", path.string()));
    if (wal.ok()) break;
    if (!wal.error().is(Errc::busy) || attempt >= 200) return std::move(wal).error();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  VRDMA_TRY(exec(db, "PRAGMA synchronous=FULL", "cannot configure the VF ledger"));
  {
    Txn t(db);
    VRDMA_TRY(t.begin());
    VRDMA_TRY(exec(db, kSchema, fmt::format("cannot create the VF ledger schema in {}", path.string())));
    Stmt get(db, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (!get.ok()) return sqlite_error(db, get.prepare_rc(), "cannot read the VF ledger version");
    if (get.step() == SQLITE_ROW) {
      auto v = parse_sysfs_int(get.text(0), 0, 1000000);
      if (!v || *v > kSchemaVersion)
        return make_error(Errc::bad_state, fmt::format("the VF ledger {} has schema version '{}', newer than this "
                                                       "vrdma understands ({}); use the matching vrdmactl",
                                                       path.string(), get.text(0).substr(0, 16), kSchemaVersion));
    } else {
      VRDMA_TRY(exec(db, "INSERT INTO meta(key, value) VALUES('schema_version', '1'), ('kind', 'vrdma-vf-ledger')",
                     "cannot initialise the VF ledger"));
    }
    VRDMA_TRY(t.commit());
  }
  return Ledger(std::move(impl));
}

Result<Allocation> Ledger::allocate(const AllocateRequest& req, std::span<const Candidate> candidates) {
  VRDMA_TRY(check_owner(req.owner));
  sqlite3* db = impl_->db.get();
  Txn t(db);
  VRDMA_TRY(t.begin());
  auto held = impl_->query_one("purpose = ? AND owner = ?", {std::string(purpose_name(req.purpose)), req.owner});
  if (!held) return std::move(held).error();
  if (*held)
    return make_error(Errc::busy, fmt::format("{} '{}' already holds VF {}; release it first ('vrdmactl vf release "
                                              "--vf {}') or use another owner name",
                                              purpose_name(req.purpose), req.owner, (*held)->vf.str(),
                                              (*held)->vf.str()));
  std::set<std::string> taken;
  {
    Stmt st(db, "SELECT vf FROM allocations");
    if (!st.ok()) return sqlite_error(db, st.prepare_rc(), "cannot read the VF ledger");
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) taken.insert(st.text(0));
    if (rc != SQLITE_DONE) return sqlite_error(db, rc, "cannot read the VF ledger");
  }
  for (const auto& c : candidates) {
    const std::string vf = c.vf.str();
    if (taken.count(vf)) continue;
    Allocation a{c.vf, c.pf, c.vf_index, req.purpose, req.owner, req.owner_pid, req.boot_id, AllocState::reserved, now()};
    Stmt ins(db, fmt::format("INSERT INTO allocations({}) VALUES(?, ?, ?, ?, ?, ?, ?, 'reserved', ?)", kColumns));
    if (!ins.ok()) return sqlite_error(db, ins.prepare_rc(), "cannot prepare a ledger insert");
    ins.bind(1, vf).bind(2, c.pf.str()).bind(3, static_cast<std::int64_t>(c.vf_index))
        .bind(4, purpose_name(req.purpose)).bind(5, req.owner).bind(6, req.owner_pid).bind(7, req.boot_id)
        .bind(8, a.allocated_at);
    int rc = ins.step();
    if (rc != SQLITE_DONE) return sqlite_error(db, rc, fmt::format("cannot record VF {} in the ledger", vf));
    VRDMA_TRY(impl_->event(vf, "allocate", fmt::format("{} '{}' pid {}", purpose_name(req.purpose), req.owner,
                                                       req.owner_pid)));
    VRDMA_TRY(t.commit());
    return a;
  }
  return make_error(Errc::no_memory, fmt::format("no free VF: all {} matching VFs are already held (see 'vrdmactl vf "
                                                 "list'); enable more VFs or release one",
                                                 candidates.size()));
}

Status Ledger::activate(const PciAddress& vf, bool persistent) {
  sqlite3* db = impl_->db.get();
  Txn t(db);
  VRDMA_TRY(t.begin());
  Stmt st(db, persistent ? "UPDATE allocations SET state = 'active', owner_pid = 0 WHERE vf = ? AND state = 'reserved'"
                         : "UPDATE allocations SET state = 'active' WHERE vf = ? AND state = 'reserved'");
  if (!st.ok()) return sqlite_error(db, st.prepare_rc(), "cannot prepare a ledger update");
  st.bind(1, vf.str());
  int rc = st.step();
  if (rc != SQLITE_DONE) return sqlite_error(db, rc, "cannot update the VF ledger");
  if (sqlite3_changes(db) != 1)
    return make_error(Errc::bad_state, fmt::format("VF {} is not reserved in the ledger, so it cannot be activated",
                                                   vf.str()));
  VRDMA_TRY(impl_->event(vf.str(), "activate", persistent ? "persistent" : "process-owned"));
  return t.commit();
}

Status Ledger::hand_over(const PciAddress& vf, std::string_view owner, std::int64_t pid) {
  if (pid < 0 || pid > 0x3fffffff)
    return make_error(Errc::invalid_argument, fmt::format("{} is not a process id", pid));
  sqlite3* db = impl_->db.get();
  Txn t(db);
  VRDMA_TRY(t.begin());
  Stmt st(db, "UPDATE allocations SET owner_pid = ? WHERE vf = ? AND owner = ? AND state = 'active'");
  if (!st.ok()) return sqlite_error(db, st.prepare_rc(), "cannot prepare a ledger update");
  st.bind(1, pid).bind(2, vf.str()).bind(3, std::string(owner));
  int rc = st.step();
  if (rc != SQLITE_DONE) return sqlite_error(db, rc, "cannot update the VF ledger");
  if (sqlite3_changes(db) != 1)
    return make_error(Errc::bad_state, fmt::format("VF {} is not held active by '{}' in the ledger, so it cannot be "
                                                   "handed to process {}",
                                                   vf.str(), owner.substr(0, 128), pid));
  VRDMA_TRY(impl_->event(vf.str(), "hand-over", fmt::format("to pid {}", pid)));
  return t.commit();
}

Status Ledger::mark_releasing(const PciAddress& vf) {
  sqlite3* db = impl_->db.get();
  Txn t(db);
  VRDMA_TRY(t.begin());
  Stmt st(db, "UPDATE allocations SET state = 'releasing' WHERE vf = ?");
  if (!st.ok()) return sqlite_error(db, st.prepare_rc(), "cannot prepare a ledger update");
  st.bind(1, vf.str());
  int rc = st.step();
  if (rc != SQLITE_DONE) return sqlite_error(db, rc, "cannot update the VF ledger");
  if (sqlite3_changes(db) != 1)
    return make_error(Errc::not_found, fmt::format("VF {} is not allocated in the ledger", vf.str()));
  return t.commit();
}

Status Ledger::release(const PciAddress& vf, const std::optional<std::string>& owner) {
  sqlite3* db = impl_->db.get();
  Txn t(db);
  VRDMA_TRY(t.begin());
  auto cur = impl_->query_one("vf = ?", {vf.str()});
  if (!cur) return std::move(cur).error();
  if (!*cur)
    return make_error(Errc::not_found, fmt::format("VF {} is not allocated in the ledger; nothing to release", vf.str()));
  if (owner && (*cur)->owner != *owner)
    return make_error(Errc::access_denied, fmt::format("VF {} is held by {}, not by '{}'; it was not released",
                                                       vf.str(), describe(**cur), owner->substr(0, 128)));
  VRDMA_TRY(impl_->remove(vf.str()));
  VRDMA_TRY(impl_->event(vf.str(), "release", describe(**cur)));
  return t.commit();
}

Result<std::vector<Allocation>> Ledger::list() {
  sqlite3* db = impl_->db.get();
  Stmt st(db, fmt::format("SELECT {} FROM allocations ORDER BY vf", kColumns));
  if (!st.ok()) return sqlite_error(db, st.prepare_rc(), "cannot read the VF ledger");
  std::vector<Allocation> out;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    auto a = row_to_allocation(st);
    if (!a) return std::move(a).error();
    out.push_back(std::move(*a));
  }
  if (rc != SQLITE_DONE) return sqlite_error(db, rc, "cannot read the VF ledger");
  return out;
}

Result<std::optional<Allocation>> Ledger::find(const PciAddress& vf) { return impl_->query_one("vf = ?", {vf.str()}); }

Result<std::optional<Allocation>> Ledger::find_owner(Purpose p, std::string_view owner) {
  return impl_->query_one("purpose = ? AND owner = ?", {std::string(purpose_name(p)), std::string(owner)});
}

Result<std::vector<ReconcileAction>> Ledger::reconcile(const Inventory& inv, const ReconcileEnv& env) {
  sqlite3* db = impl_->db.get();
  auto alive = env.pid_alive ? env.pid_alive : process_alive;
  Txn t(db);
  VRDMA_TRY(t.begin());
  std::vector<ReconcileAction> actions;
  std::vector<std::string> drop;
  std::set<PciAddress> tracked;
  {
    Stmt st(db, fmt::format("SELECT {} FROM allocations ORDER BY vf", kColumns));
    if (!st.ok()) return sqlite_error(db, st.prepare_rc(), "cannot read the VF ledger");
    int rc;
    while ((rc = st.step()) == SQLITE_ROW) {
      std::string raw = st.text(0);
      auto ar = row_to_allocation(st);
      if (!ar) {
        drop.push_back(raw);
        actions.push_back({ReconcileAction::Kind::freed_missing_vf, {},
                           fmt::format("the ledger row for '{}' was unreadable and has been removed", raw.substr(0, 40))});
        continue;
      }
      const Allocation& a = *ar;
      const PciFunction* f = inv.find(a.vf);
      using K = ReconcileAction::Kind;
      auto act = [&](K k, std::string s) {
        drop.push_back(raw);
        actions.push_back({k, a.vf, std::move(s)});
      };
      if (f == nullptr || f->is_pf()) {
        act(K::freed_missing_vf, fmt::format("VF {} ({}) no longer exists in sysfs (VFs disabled or the host "
                                             "rebooted); its ledger entry was removed",
                                             a.vf.str(), describe(a)));
      } else if (f->pf != a.pf || f->vf_index != a.vf_index) {
        act(K::freed_pf_mismatch, fmt::format("VF {} ({}) was recorded as VF {} of PF {} but sysfs shows it as VF {} "
                                              "of PF {}; the entry is stale and was removed",
                                              a.vf.str(), describe(a), a.vf_index, a.pf.str(),
                                              f->vf_index ? std::to_string(*f->vf_index) : "?",
                                              f->pf ? f->pf->str() : "?"));
      } else if (a.state == AllocState::releasing) {
        act(K::finished_release, fmt::format("VF {} ({}) was being released when its releaser stopped; the release "
                                             "was finished",
                                             a.vf.str(), describe(a)));
      } else if (a.owner_pid != 0 && !env.boot_id.empty() && !a.boot_id.empty() && a.boot_id != env.boot_id) {
        act(K::freed_after_reboot, fmt::format("VF {} ({}) belonged to process {} of an earlier boot; it was freed",
                                               a.vf.str(), describe(a), a.owner_pid));
      } else if (a.owner_pid != 0 && !alive(a.owner_pid)) {
        act(K::freed_dead_owner, fmt::format("VF {} ({}, {}) belonged to process {}, which is gone; it was freed",
                                             a.vf.str(), describe(a), alloc_state_name(a.state), a.owner_pid));
      } else {
        tracked.insert(a.vf);
      }
    }
    if (rc != SQLITE_DONE) return sqlite_error(db, rc, "cannot read the VF ledger");
  }
  for (const auto& vf : drop) VRDMA_TRY(impl_->remove(vf));
  for (const auto& a : actions) VRDMA_TRY(impl_->event(a.vf.str(), "reconcile", a.sentence));
  for (const auto& f : inv.functions) {
    if (f.is_pf() || f.driver != "vfio-pci" || tracked.count(f.addr)) continue;
    actions.push_back({ReconcileAction::Kind::untracked_vfio, f.addr,
                       fmt::format("VF {} is bound to vfio-pci but the ledger has no record of it; something outside "
                                   "vrdma may have given it to a guest, so it is left alone and not handed out",
                                   f.addr.str())});
  }
  VRDMA_TRY(t.commit());
  for (const auto& a : actions) log::info("reconcile: {}", a.sentence);
  return actions;
}

}  // namespace vrdma::sriov
