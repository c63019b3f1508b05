// The VF pool's crash-safe ledger: which VF belongs to which guest or migration, in SQLite (WAL,
// synchronous=FULL, every change in one BEGIN IMMEDIATE transaction). The vf column is the
// primary key, so two callers (threads or processes) can never hold the same VF; a caller killed
// mid-transaction leaves nothing behind (SQLite rolls the journal back on next open).
// Schema and states: docs/sriov.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/sriov/discovery.hpp"
#include "vrdma/sriov/parse.hpp"

namespace vrdma::sriov {

enum class Purpose { guest, migration };
std::string_view purpose_name(Purpose p);
Result<Purpose> parse_purpose(std::string_view s);

// reserved: row written, VF not yet configured; active: handed to its owner;
// releasing: owner gave it back, teardown (driver rebind) not yet finished.
enum class AllocState { reserved, active, releasing };
std::string_view alloc_state_name(AllocState s);

struct Allocation {
  PciAddress vf;
  PciAddress pf;
  std::uint32_t vf_index = 0;
  Purpose purpose = Purpose::guest;
  std::string owner;           // guest device ("vm1/rdma0") or migration id
  std::int64_t owner_pid = 0;  // process holding it; 0 = held until released (CLI assignments)
  std::string boot_id;         // /proc/sys/kernel/random/boot_id when allocated
  AllocState state = AllocState::reserved;
  std::int64_t allocated_at = 0;  // unix seconds
};

struct Candidate {
  PciAddress vf;
  PciAddress pf;
  std::uint32_t vf_index = 0;
};

struct AllocateRequest {
  Purpose purpose = Purpose::guest;
  std::string owner;
  std::int64_t owner_pid = 0;
  std::string boot_id;
};

// What reconcile changed or found, one sentence each.
struct ReconcileAction {
  enum class Kind { freed_dead_owner, freed_missing_vf, freed_after_reboot, finished_release, freed_pf_mismatch,
                    untracked_vfio };
  Kind kind;
  PciAddress vf;
  std::string sentence;
};

struct ReconcileEnv {
  std::string boot_id;                            // this boot
  std::function<bool(std::int64_t pid)> pid_alive;  // default: process_alive
};

class Ledger {
 public:
  // Opens (creating if needed) the ledger; creates the parent directory. Errors: io_error with
  // the path, bad_state when the file is not a vrdma ledger or has a newer schema.
  static Result<Ledger> open(const std::filesystem::path& path);
  Ledger(Ledger&&) noexcept;
  Ledger& operator=(Ledger&&) noexcept;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger();

  // Records the first candidate no one holds, in state `reserved`. Errors: busy when the owner
  // already holds a VF for this purpose, no_memory when every candidate is taken.
  Result<Allocation> allocate(const AllocateRequest& req, std::span<const Candidate> candidates);
  // reserved -> active. A persistent assignment (a guest assigned by the CLI) drops the owner pid:
  // it is held until released, not until the assigning process exits.
  Status activate(const PciAddress& vf, bool persistent);
  // An active VF of `owner` passes to process `pid` (0: held until released): the allocator
  // started the backend that uses the VF, and reconcile now frees the VF when that process is
  // gone rather than when the allocator exits. Errors: bad_state when `owner` holds no active `vf`.
  Status hand_over(const PciAddress& vf, std::string_view owner, std::int64_t pid);
  // active -> releasing (teardown in progress; reconcile finishes it after a crash).
  Status mark_releasing(const PciAddress& vf);
  // Removes the row. With `owner`, refuses (access_denied) when someone else holds the VF.
  Status release(const PciAddress& vf, const std::optional<std::string>& owner = std::nullopt);

  Result<std::vector<Allocation>> list();
  Result<std::optional<Allocation>> find(const PciAddress& vf);
  Result<std::optional<Allocation>> find_owner(Purpose p, std::string_view owner);

  // Brings the ledger in line with what sysfs shows after a crash or reboot: frees rows whose VF
  // vanished or moved to another PF, whose owner process died, or that were recorded in an
  // earlier boot by a process; finishes `releasing` rows; reports VFs bound to vfio-pci that the
  // ledger does not know (left alone: something outside vrdma may use them).
  Result<std::vector<ReconcileAction>> reconcile(const Inventory& inv, const ReconcileEnv& env);

  [[nodiscard]] const std::filesystem::path& path() const;

 private:
  struct Impl;
  explicit Ledger(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether process `pid` runs (a zombie does not: it holds no VF any more).
bool process_alive(std::int64_t pid);

// This boot's id (/proc/sys/kernel/random/boot_id), "" if unreadable.
std::string current_boot_id();

}  // namespace vrdma::sriov
