// The IBA QP state machine (IBA vol 1 11.2.5, table of attributes per transition), shared by
// every provider so that all of them reject the same masks the way ibv_modify_qp does.
#pragma once

#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/types.hpp"

namespace vrdma::nicdrv {

// Checks that cur -> next is a legal transition for a QP of this type and that `mask` has every
// required attribute and nothing that is not allowed. `mask` includes QpAttrMask::state unless
// the call keeps the state. Returns invalid_argument with a sentence naming the offending bits.
Status check_qp_transition(QpType type, QpState cur, QpState next, QpAttrMask mask);

// "STATE|PORT|QKEY"-style names of the bits in a mask.
std::string mask_names(QpAttrMask mask);

}  // namespace vrdma::nicdrv
