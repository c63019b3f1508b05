#define BOOST_TEST_MODULE vhost_event_loop
#include <boost/test/unit_test.hpp>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <thread>

#include "vrdma/vhost/event_loop.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

BOOST_AUTO_TEST_CASE(callbacks_run_for_ready_fds_only) {
  auto loop = EventLoop::create().value();
  UniqueFd a(::eventfd(0, EFD_NONBLOCK)), b(::eventfd(0, EFD_NONBLOCK));
  int ran_a = 0, ran_b = 0;
  BOOST_REQUIRE(loop.add(a.get(), EPOLLIN, [&](std::uint32_t) {
    std::uint64_t v;
    (void)!::read(a.get(), &v, 8);
    ++ran_a;
  }).ok());
  BOOST_REQUIRE(loop.add(b.get(), EPOLLIN, [&](std::uint32_t) { ++ran_b; }).ok());
  BOOST_TEST(!loop.add(a.get(), EPOLLIN, [](std::uint32_t) {}).ok());  // one registration per fd
  const std::uint64_t one = 1;
  BOOST_REQUIRE(::write(a.get(), &one, 8) == 8);
  BOOST_TEST(loop.run_once(100).value() == 1);
  BOOST_TEST(ran_a == 1);
  BOOST_TEST(ran_b == 0);
  BOOST_TEST(loop.run_once(0).value() == 0);
}

BOOST_AUTO_TEST_CASE(a_callback_may_remove_another_fd_whose_event_is_pending) {
  auto loop = EventLoop::create().value();
  UniqueFd a(::eventfd(1, EFD_NONBLOCK)), b(::eventfd(1, EFD_NONBLOCK));
  int ran = 0;
  BOOST_REQUIRE(loop.add(a.get(), EPOLLIN, [&](std::uint32_t) { ++ran; loop.remove(b.get()); loop.remove(a.get()); }).ok());
  BOOST_REQUIRE(loop.add(b.get(), EPOLLIN, [&](std::uint32_t) { ++ran; loop.remove(a.get()); loop.remove(b.get()); }).ok());
  BOOST_TEST(loop.run_once(100).value() == 1);  // whichever ran first removed the other
  BOOST_TEST(ran == 1);
  BOOST_TEST(!loop.watching(a.get()));
  BOOST_TEST(!loop.watching(b.get()));
}

BOOST_AUTO_TEST_CASE(stop_from_another_thread_ends_run) {
  auto loop = EventLoop::create().value();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    loop.stop();
  });
  const auto t0 = std::chrono::steady_clock::now();
  BOOST_TEST(loop.run().ok());
  t.join();
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)));
}

// vrdmad --poll-us: an event starts the polling rounds; a descriptor that becomes ready while
// polling is still served (within 16 rounds), and `idle` runs once `poll` has found nothing for
// the window.
BOOST_AUTO_TEST_CASE(run_polling_serves_descriptors_while_polling_and_goes_idle_after_the_window) {
  auto loop = EventLoop::create().value();
  UniqueFd kick(::eventfd(1, EFD_NONBLOCK)), msg(::eventfd(0, EFD_NONBLOCK));
  int polls = 0, idles = 0, msgs = 0, polls_at_msg = -1;
  std::uint64_t v;
  BOOST_REQUIRE(loop.add(kick.get(), EPOLLIN, [&](std::uint32_t) { (void)!::read(kick.get(), &v, 8); }).ok());
  BOOST_REQUIRE(loop.add(msg.get(), EPOLLIN, [&](std::uint32_t) {
    (void)!::read(msg.get(), &v, 8);
    ++msgs;
    polls_at_msg = polls;
  }).ok());
  const std::uint64_t one = 1;
  const auto poll = [&] {
    ++polls;
    if (polls == 3) BOOST_REQUIRE(::write(msg.get(), &one, 8) == 8);
    return polls <= 5;  // work in the first five rounds
  };
  const auto idle = [&] {
    ++idles;
    loop.stop();
  };
  BOOST_TEST(loop.run_polling(std::chrono::milliseconds(50), poll, idle).ok());
  BOOST_TEST(idles == 1);
  BOOST_TEST(msgs == 1);
  BOOST_TEST(polls_at_msg >= 3);
  BOOST_TEST(polls_at_msg <= 3 + 16);
  BOOST_TEST(polls > 5);
}
