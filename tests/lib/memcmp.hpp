// Compares a migrated guest's RAM with its source's, page by page, and says of every page that
// differs what it held for the device and whether the backend wrote it (from the backends'
// write journals, vrdma/vhost/write_journal.hpp): written after the stop, written while the
// dirty log was on without being marked, or never written by the backend at all (then the VMM
// lost it). Used by tests/tools/vrdma_memcmp.cpp and the C++ VM migration tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vrdma/common/result.hpp"

namespace vrdma::test::memcmp {

inline constexpr std::uint64_t kPage = 4096;

// The file that holds a QEMU process's guest RAM: its "memory-backend-memfd" memfd as
// /proc/PID/fd/N (opening it gives the same memory, also after QEMU exits).
Result<std::string> ram_of_pid(int pid);

struct Page {
  std::uint64_t offset = 0;  // in the RAM file
  std::uint64_t gpa = 0;
  bool gpa_known = false;    // from a journal's memory table; else gpa == offset is assumed
  std::uint32_t bytes = 0;   // bytes that differ
  std::uint32_t first = 0;   // offset in the page of the first
  std::vector<std::string> holds;  // the device's objects on it ("CQ ring 3", ...)
  // The backend's writes into it, from the journals.
  std::uint64_t writes = 0, unlogged = 0, after_stop = 0, unlogged_while_migrating = 0;
  std::optional<double> last_write_ms;  // the last write's time relative to the stop (negative: before)
  bool backend = false;                 // the backend's doing: written after the stop or unlogged while migrating
  std::string verdict;                  // a sentence
};

struct Report {
  std::uint64_t pages = 0;          // compared
  std::uint64_t differing = 0;      // all of them (pages lists at most max_pages)
  std::uint64_t backend_pages = 0;  // of those, the backend's doing
  std::uint64_t journal_writes = 0; // writes the journals recorded
  std::uint64_t journal_after_stop = 0;  // of those, made after the stop (any page)
  bool journals = false;
  double seconds = 0;
  std::vector<Page> pages_listed;
  [[nodiscard]] std::uint64_t vmm_pages() const { return differing - backend_pages; }
  [[nodiscard]] nlohmann::json json() const;
  [[nodiscard]] std::string text() const;  // sentences, a line per listed page
};

// `source`, `dest`: RAM files of the same size. `journals`: write journals of the source's
// backends (may be empty).
Result<Report> compare(const std::string& source, const std::string& dest, const std::vector<std::string>& journals,
                       std::size_t max_pages = 64);

}  // namespace vrdma::test::memcmp
