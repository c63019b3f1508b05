// The IBA QP state machine: legal transitions, required and allowed attribute masks.
#define BOOST_TEST_MODULE qp_state
#include <boost/test/unit_test.hpp>

#include "vrdma/nicdrv/qp_state.hpp"

using namespace vrdma::nicdrv;
using M = QpAttrMask;
using S = QpState;

BOOST_AUTO_TEST_CASE(rc_bring_up_masks) {
  BOOST_TEST(check_qp_transition(QpType::rc, S::reset, S::init, M::state | M::pkey_index | M::port | M::access_flags).ok());
  auto missing = check_qp_transition(QpType::rc, S::reset, S::init, M::state | M::pkey_index | M::port);
  BOOST_REQUIRE(!missing.ok());
  BOOST_TEST(missing.error().message.find("ACCESS_FLAGS") != std::string::npos);
  auto extra = check_qp_transition(QpType::rc, S::reset, S::init, M::state | M::pkey_index | M::port | M::access_flags | M::qkey);
  BOOST_REQUIRE(!extra.ok());
  BOOST_TEST(extra.error().message.find("QKEY") != std::string::npos);
  M rtr = M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic | M::min_rnr_timer;
  BOOST_TEST(check_qp_transition(QpType::rc, S::init, S::rtr, rtr).ok());
  BOOST_TEST(check_qp_transition(QpType::rc, S::init, S::rtr, rtr | M::pkey_index | M::access_flags).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::init, S::rtr, rtr & ~M::dest_qpn).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::init, S::rtr, rtr | M::sq_psn).ok());
  M rts = M::state | M::timeout | M::retry_cnt | M::rnr_retry | M::sq_psn | M::max_qp_rd_atomic;
  BOOST_TEST(check_qp_transition(QpType::rc, S::rtr, S::rts, rts).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::rtr, S::rts, rts & ~M::timeout).ok());
}

BOOST_AUTO_TEST_CASE(ud_bring_up_masks) {
  BOOST_TEST(check_qp_transition(QpType::ud, S::reset, S::init, M::state | M::pkey_index | M::port | M::qkey).ok());
  BOOST_TEST(!check_qp_transition(QpType::ud, S::reset, S::init, M::state | M::pkey_index | M::port | M::access_flags).ok());
  BOOST_TEST(check_qp_transition(QpType::ud, S::init, S::rtr, M::state).ok());
  BOOST_TEST(!check_qp_transition(QpType::ud, S::init, S::rtr, M::state | M::av).ok());
  BOOST_TEST(check_qp_transition(QpType::ud, S::rtr, S::rts, M::state | M::sq_psn).ok());
  BOOST_TEST(check_qp_transition(QpType::ud, S::sqe, S::rts, M::state).ok());
}

// QP1 as the kernel's ib_mad brings it up: PKEY_INDEX and QKEY, no PORT (the kernel's
// qp_state_table leaves it out of GSI's rows: QP1 is bound to its port).
BOOST_AUTO_TEST_CASE(gsi_bring_up_masks_have_no_port) {
  BOOST_TEST(check_qp_transition(QpType::gsi, S::reset, S::init, M::state | M::pkey_index | M::qkey).ok());
  auto with_port = check_qp_transition(QpType::gsi, S::reset, S::init, M::state | M::pkey_index | M::port | M::qkey);
  BOOST_REQUIRE(!with_port.ok());
  BOOST_TEST(with_port.error().message.find("GSI QP RESET->INIT does not allow PORT") != std::string::npos,
             with_port.error().message);
  BOOST_TEST(check_qp_transition(QpType::gsi, S::init, S::rtr, M::state).ok());
  BOOST_TEST(check_qp_transition(QpType::gsi, S::rtr, S::rts, M::state | M::sq_psn).ok());
  BOOST_TEST(!check_qp_transition(QpType::gsi, S::rtr, S::rts, M::state | M::sq_psn | M::timeout).ok());
}

BOOST_AUTO_TEST_CASE(illegal_transitions) {
  BOOST_TEST(!check_qp_transition(QpType::rc, S::reset, S::rtr, M::state).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::reset, S::rts, M::state).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::init, S::rts, M::state).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::rtr, S::sqd, M::state).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::err, S::rts, M::state).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::rtr, S::init, M::state).ok());
  // Any state may go to RESET or ERR, with no other attributes.
  for (S s : {S::reset, S::init, S::rtr, S::rts, S::sqd, S::sqe, S::err}) {
    BOOST_TEST(check_qp_transition(QpType::rc, s, S::reset, M::state).ok());
    BOOST_TEST(check_qp_transition(QpType::rc, s, S::err, M::state).ok());
    BOOST_TEST(!check_qp_transition(QpType::rc, s, S::err, M::state | M::qkey).ok());
  }
  BOOST_TEST(check_qp_transition(QpType::rc, S::rts, S::sqd, M::state).ok());
  BOOST_TEST(check_qp_transition(QpType::rc, S::sqd, S::rts, M::state).ok());
  // Staying in RTS may change a few things, never the PSNs.
  BOOST_TEST(check_qp_transition(QpType::rc, S::rts, S::rts, M::min_rnr_timer).ok());
  BOOST_TEST(!check_qp_transition(QpType::rc, S::rts, S::rts, M::sq_psn).ok());
}

BOOST_AUTO_TEST_CASE(mask_names_read_like_verbs) {
  BOOST_TEST(mask_names(M::state | M::qkey) == "STATE|QKEY");
  BOOST_TEST(mask_names(M::none) == "none");
  BOOST_TEST(mask_names(M::dest_qpn) == "DEST_QPN");
}
