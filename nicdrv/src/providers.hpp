// The providers compiled into libvrdma_nicdrv. Explicit (not self-registering) so that static
// linking can never drop one.
#pragma once

#include <array>

#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::nicdrv::detail {

using ProviderMaker = Provider (*)();
inline constexpr std::array<ProviderMaker, 0> kBuiltinProviders{};

}  // namespace vrdma::nicdrv::detail
