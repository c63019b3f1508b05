// The providers compiled into libvrdma_nicdrv. Explicit (not self-registering) so that static
// linking can never drop one.
#pragma once

#include <array>

#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::nicdrv::detail {

using ProviderMaker = Provider (*)();
Provider make_soft_provider();
Provider make_verbs_provider();
Provider make_pv_provider();  // vhost/src/pv (libpvverbs)
inline constexpr std::array<ProviderMaker, 3> kBuiltinProviders{&make_soft_provider, &make_verbs_provider,
                                                                &make_pv_provider};

}  // namespace vrdma::nicdrv::detail
