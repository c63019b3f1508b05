#include "vrdma/common/version.hpp"

namespace vrdma {

std::string_view version() noexcept { return VRDMA_VERSION; }

}  // namespace vrdma
