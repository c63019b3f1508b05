// The vrdma release every tool and daemon reports: `--version`, vrdmad's status, the migration
// HELLO (CMake's PROJECT_VERSION).
#pragma once

#include <string_view>

namespace vrdma {

std::string_view version() noexcept;

}  // namespace vrdma
