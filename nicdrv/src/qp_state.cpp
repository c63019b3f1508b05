#include "vrdma/nicdrv/qp_state.hpp"

#include <array>

namespace vrdma::nicdrv {
namespace {

using M = QpAttrMask;

struct Rule {
  bool valid = false;
  M req_rc = M::none, opt_rc = M::none;
  M req_ud = M::none, opt_ud = M::none;
};

constexpr std::size_t kStates = 7;
using Table = std::array<std::array<Rule, kStates>, kStates>;

constexpr std::size_t idx(QpState s) { return static_cast<std::size_t>(s); }

// IBA 11.2.5 / the kernel's qp_state_table: required and optional attributes per transition.
constexpr Table make_table() {
  Table t{};
  for (std::size_t s = 0; s < kStates; ++s) {
    t[s][idx(QpState::reset)] = Rule{true};
    t[s][idx(QpState::err)] = Rule{true};
  }
  t[idx(QpState::reset)][idx(QpState::init)] =
      Rule{true, M::pkey_index | M::port | M::access_flags, M::none, M::pkey_index | M::port | M::qkey, M::none};
  t[idx(QpState::init)][idx(QpState::init)] =
      Rule{true, M::none, M::pkey_index | M::port | M::access_flags, M::none, M::pkey_index | M::port | M::qkey};
  t[idx(QpState::init)][idx(QpState::rtr)] =
      Rule{true, M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic | M::min_rnr_timer,
           M::alt_path | M::access_flags | M::pkey_index, M::none, M::pkey_index | M::qkey};
  t[idx(QpState::rtr)][idx(QpState::rts)] =
      Rule{true, M::timeout | M::retry_cnt | M::rnr_retry | M::sq_psn | M::max_qp_rd_atomic,
           M::cur_state | M::alt_path | M::access_flags | M::min_rnr_timer | M::path_mig_state, M::sq_psn,
           M::cur_state | M::qkey};
  t[idx(QpState::rts)][idx(QpState::rts)] =
      Rule{true, M::none, M::cur_state | M::access_flags | M::alt_path | M::path_mig_state | M::min_rnr_timer,
           M::none, M::cur_state | M::qkey};
  t[idx(QpState::rts)][idx(QpState::sqd)] =
      Rule{true, M::none, M::en_sqd_async_notify, M::none, M::en_sqd_async_notify};
  t[idx(QpState::sqd)][idx(QpState::rts)] =
      Rule{true, M::none, M::cur_state | M::alt_path | M::access_flags | M::min_rnr_timer | M::path_mig_state,
           M::none, M::cur_state | M::qkey};
  t[idx(QpState::sqd)][idx(QpState::sqd)] =
      Rule{true, M::none,
           M::av | M::alt_path | M::access_flags | M::pkey_index | M::min_rnr_timer | M::path_mig_state |
               M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic | M::max_dest_rd_atomic,
           M::none, M::pkey_index | M::qkey};
  // SQE exists for UD (and UC): a send error stops the send queue; SQE -> RTS restarts it.
  t[idx(QpState::sqe)][idx(QpState::rts)] = Rule{true, M::none, M::none, M::none, M::cur_state | M::qkey};
  t[idx(QpState::rts)][idx(QpState::sqe)] = Rule{false};
  return t;
}

constexpr Table kTable = make_table();
static_assert(kTable[idx(QpState::reset)][idx(QpState::init)].valid);
static_assert(!kTable[idx(QpState::reset)][idx(QpState::rts)].valid);
static_assert(!kTable[idx(QpState::init)][idx(QpState::rts)].valid);

constexpr std::array<std::string_view, 21> kMaskNames = {
    "STATE",   "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX", "PORT",
    "QKEY",    "AV",        "PATH_MTU",            "TIMEOUT",      "RETRY_CNT",  "RNR_RETRY",
    "RQ_PSN",  "MAX_QP_RD_ATOMIC", "ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC",
    "PATH_MIG_STATE", "CAP", "DEST_QPN"};

}  // namespace

std::string mask_names(QpAttrMask mask) {
  std::string out;
  auto bits = static_cast<std::uint32_t>(mask);
  for (std::size_t i = 0; i < kMaskNames.size(); ++i)
    if ((bits & (1u << i)) != 0) {
      if (!out.empty()) out += '|';
      out += kMaskNames[i];
    }
  return out.empty() ? "none" : out;
}

Status check_qp_transition(QpType type, QpState cur, QpState next, QpAttrMask mask) {
  if (idx(cur) >= kStates || idx(next) >= kStates)
    return make_error(Errc::invalid_argument, "QP state out of range");
  const Rule& r = kTable[idx(cur)][idx(next)];
  auto name = [&] {
    return std::string(to_string(type)) + " QP " + std::string(to_string(cur)) + "->" + std::string(to_string(next));
  };
  if (!r.valid) return make_error(Errc::invalid_argument, name() + " is not a legal transition (IBA 11.2.5)");
  M req = type == QpType::rc ? r.req_rc : r.req_ud;
  M opt = type == QpType::rc ? r.opt_rc : r.opt_ud;
  // QP1 is bound to its port: the kernel's qp_state_table leaves PORT out of GSI's rows.
  if (type == QpType::gsi) {
    req = req & ~M::port;
    opt = opt & ~M::port;
  }
  M body = mask & ~M::state;
  if ((body & req) != req)
    return make_error(Errc::invalid_argument, name() + " requires " + mask_names(req & ~body) + " in the attribute mask");
  M extra = body & ~(req | opt);
  // RESET and ERR targets take no attributes but are reachable from anywhere.
  if (any(extra))
    return make_error(Errc::invalid_argument, name() + " does not allow " + mask_names(extra) + " in the attribute mask");
  return {};
}

}  // namespace vrdma::nicdrv
