// A hostile vhost-user frontend against vrdmad's event loop (issue 22): one test per way a
// frontend could stop the loop for good or for minutes. In each, while the attack runs, the
// victim's control socket, another vrdmad's and that vrdmad's guest (moving checked data) keep
// answering within 100 ms (500 ms under the sanitizers); afterwards the victim serves a guest
// of its own, and its log holds no sanitizer report. The attacks themselves are in
// support/hostile_frontend.hpp (the soak test runs them all in a loop).
#define BOOST_TEST_MODULE vrdmad_frontend_hostile
#include <boost/test/unit_test.hpp>

#include "hostile_frontend.hpp"

using namespace vrdma;
using namespace vrdma::test;
using namespace vrdma::test::hostile;

namespace {

// Runs `attack` against a fresh victim under a Watch, then checks the victim.
template <class Attack>
void against_a_victim(const std::string& name, Attack attack) {
  auto& w = World::get();
  auto v = w.victim();
  {
    const auto t0 = Clock::now();
    Watch watch(*v, *w.other, *w.guest);
    attack(*v);
    // Watched for a second at least, however soon the victim disposed of the attacker.
    if (const auto spent = Clock::now() - t0; spent < 1s) std::this_thread::sleep_for(1s - spent);
    watch.check(name);
  }
  BOOST_CHECK_MESSAGE(v->child->alive(), "the victim vrdmad died:\n" << read_file(v->log));
  BOOST_CHECK_MESSAGE(checked_write_on(*v, 7), "the victim does not serve a guest after: " << name);
  no_sanitizer_reports(*v);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_semaphore_kick_eventfd_is_refused_and_the_loop_never_spins_on_it) {
  against_a_victim("semaphore kick", [](const Vrdmad& v) { semaphore_kick(v, 1500ms); });
}

BOOST_AUTO_TEST_CASE(call_and_err_fds_that_would_block_a_write_never_block_the_loop) {
  against_a_victim("full call/err fds", [](const Vrdmad& v) { full_call_and_err(v, 2000ms); });
}

BOOST_AUTO_TEST_CASE(a_frontend_that_reads_no_replies_is_disconnected_once_its_backlog_is_full) {
  against_a_victim("unread replies", [](const Vrdmad& v) { unread_replies(v, 4000ms); });
}

BOOST_AUTO_TEST_CASE(a_frontend_dripping_a_message_is_disconnected_two_seconds_after_its_first_byte) {
  against_a_victim("drip", [](const Vrdmad& v) { drip(v, 4000ms); });
}

BOOST_AUTO_TEST_CASE(guest_memory_shrunk_under_vrdmad_fails_only_that_frontends_device) {
  against_a_victim("shrunk guest memory", [](const Vrdmad& v) { shrunk_memory(v, 1000ms); });
}

// Not a frontend, but a peer of the same loop: clients of the control socket that say nothing.
BOOST_AUTO_TEST_CASE(control_clients_that_say_nothing_never_hold_the_loop) {
  against_a_victim("silent control clients", [](const Vrdmad& v) { silent_control_clients(v, 1500ms); });
}

// Issue 22 hole 6 shows only where clang's UBSan runs (the clang build of scripts/test.sh runs
// this test too): the event loop's first events, a session, a guest.
BOOST_AUTO_TEST_CASE(the_event_loop_raises_no_sanitizer_report) {
  against_a_victim("a plain session", [](const Vrdmad& v) {
    Frontend f(v.sock);
    BOOST_CHECK(f.start().ok());
    f.post_command();
    f.kick();
    BOOST_CHECK(f.wait_call(2000));
    std::this_thread::sleep_for(500ms);
  });
}
