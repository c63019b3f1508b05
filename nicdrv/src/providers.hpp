// The providers compiled into libvrdma_nicdrv: the engines of the host. Explicit (not
// self-registering) so that static linking can never drop one. nicdrv links no guest code: the
// guest's `pv` provider is added by the binaries that link it (guest/src/pv/provider.cpp).
#pragma once

#include <array>

#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::nicdrv::detail {

using ProviderMaker = Provider (*)();
Provider make_soft_provider();
Provider make_verbs_provider();
inline constexpr std::array<ProviderMaker, 2> kBuiltinProviders{&make_soft_provider, &make_verbs_provider};

}  // namespace vrdma::nicdrv::detail
