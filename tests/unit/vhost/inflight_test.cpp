#define BOOST_TEST_MODULE vhost_inflight
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include "vrdma/vhost/inflight.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

BOOST_AUTO_TEST_CASE(fresh_area_holds_no_state_until_a_ring_stamps_it) {
  auto a = InflightArea::create(2, 16);
  BOOST_REQUIRE(a);
  auto q = a->queue(1);
  BOOST_TEST(q.attached());
  BOOST_TEST(!q.holds_state());
  q.reset();
  BOOST_TEST(q.holds_state());
  BOOST_TEST(!a->queue(0).holds_state());
  BOOST_TEST(!a->queue(2).attached());
}

BOOST_AUTO_TEST_CASE(recover_lists_unfinished_heads_oldest_first_and_repairs_a_half_push) {
  auto a = InflightArea::create(1, 16);
  BOOST_REQUIRE(a);
  auto q = a->queue(0);
  q.reset();
  q.on_pop(7);
  q.on_pop(3);
  q.on_pop(9);
  q.on_push_begin(3);
  q.on_push_end(3, 1);  // completed
  q.on_push_begin(7);   // crashed after publishing used idx 2, before clearing head 7
  // A second backend maps the same area from the fd the frontend kept.
  auto b = InflightArea::attach(UniqueFd(::dup(a->fd())), InflightInfo{a->size(), 0, 1, 16, 0});
  BOOST_REQUIRE(b);
  auto r = b->queue(0);
  BOOST_TEST(r.holds_state());
  const auto heads = r.recover(2);
  BOOST_REQUIRE(heads.size() == 1u);
  BOOST_TEST(heads[0] == 9);
  // Without a half-done push both stay in flight, oldest first.
  auto c = InflightArea::create(1, 16).value();
  auto s = c.queue(0);
  s.reset();
  s.on_pop(5);
  s.on_pop(2);
  const auto h2 = s.recover(0);
  BOOST_REQUIRE(h2.size() == 2u);
  BOOST_TEST(h2[0] == 5);
  BOOST_TEST(h2[1] == 2);
}

BOOST_AUTO_TEST_CASE(attach_checks_geometry_against_the_fd) {
  auto a = InflightArea::create(1, 16).value();
  BOOST_TEST(!InflightArea::attach(UniqueFd(::dup(a.fd())), InflightInfo{a.size(), 0, 4, 16, 0}).ok());
  BOOST_TEST(!InflightArea::attach(UniqueFd(::dup(a.fd())), InflightInfo{a.size() * 8, 0, 1, 16, 0}).ok());
  BOOST_TEST(!InflightArea::attach(UniqueFd(::dup(a.fd())), InflightInfo{a.size(), 100, 1, 16, 0}).ok());
  BOOST_TEST(!InflightArea::attach(UniqueFd(::dup(a.fd())), InflightInfo{a.size(), 0, 0, 16, 0}).ok());
}
