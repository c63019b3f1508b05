// Private: reading and writing sysfs attributes, with errors that name the file.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "vrdma/common/result.hpp"

namespace vrdma::sriov::detail {

// Reads an attribute (at most 64 KiB), trailing newline removed.
Result<std::string> read_attr(const std::filesystem::path& p);
// Writes `value` in one write(2), as `echo value > p` does. The errno of a refused write is kept.
Status write_attr(const std::filesystem::path& p, std::string_view value);
// Basename of a symlink's target ("driver" -> "../../../bus/pci/drivers/qede" gives "qede").
std::optional<std::string> link_basename(const std::filesystem::path& p);
// Polls `done` until it is true or `timeout` passes (the kernel is synchronous for sysfs writes,
// so on a host this returns at once; udev renames and the test simulator may take a moment).
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

}  // namespace vrdma::sriov::detail
