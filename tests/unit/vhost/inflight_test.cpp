#define BOOST_TEST_MODULE vhost_inflight
#include <boost/test/unit_test.hpp>
#include <unistd.h>

#include <cstring>
#include <vector>

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

// ---- packed rings ----

namespace {

constexpr std::uint16_t kAvail = 1u << 7, kWrite = 2;

PackedDescCopy d(std::uint64_t addr, std::uint16_t id, std::uint16_t flags = kAvail | kWrite) {
  return {addr, 512, id, flags};
}

// Field offsets of the packed layout, for corrupting a slice the way a frontend could.
template <class T>
void poke(InflightRegion s, std::size_t off, T v) {
  std::memcpy(s.base() + off, &v, sizeof v);
}
constexpr std::size_t kHdrFreeHead = 12, kHdrOldFreeHead = 14, kHdrUsed = 16, kHdrOldUsed = 18;
std::size_t entry(std::uint16_t i) { return 32 + 32u * i; }
constexpr std::size_t kInflight = 0, kNext = 2, kLast = 4, kNum = 6;

struct Packed {
  InflightArea area = InflightArea::create(1, 16).value();
  PackedInflightRegion reg{area.queue(0)};
  Packed() { reg.reset(0, true); }
  // The same slice as a restarted backend maps it.
  [[nodiscard]] PackedInflightRegion reattached() const {
    static std::vector<InflightArea> keep;
    keep.push_back(InflightArea::attach(UniqueFd(::dup(area.fd())), InflightInfo{area.size(), 0, 1, 16, 0}).value());
    return PackedInflightRegion(keep.back().queue(0));
  }
};

bool never(std::uint16_t, bool) { return false; }

}  // namespace

BOOST_AUTO_TEST_CASE(queue_slices_have_room_for_the_packed_layout) {
  BOOST_TEST(InflightRegion::queue_bytes(16) >= 32u + 32u * 16u);
  BOOST_TEST(InflightRegion::queue_bytes(32768) >= 32u + 32u * 32768u);
  BOOST_TEST(InflightRegion::queue_bytes(16) % 64 == 0u);
}

BOOST_AUTO_TEST_CASE(packed_recover_resubmits_unfinished_chains_oldest_first_with_their_descriptors) {
  Packed p;
  const std::vector<PackedDescCopy> c1{d(0x1000, 4, kAvail | 1), d(0x2000, 4)}, c2{d(0x3000, 9)},
      c3{d(0x4000, 2, kAvail | 1), d(0x5000, 2, kAvail | 1), d(0x6000, 2)};
  auto e1 = p.reg.on_pop(c1), e2 = p.reg.on_pop(c2), e3 = p.reg.on_pop(c3);
  BOOST_REQUIRE(e1 && e2 && e3);
  // c2 completes (one used slot at 0 -> used 1), out of order.
  p.reg.on_push_begin(*e2, 1, true);
  p.reg.on_push_end(*e2);
  auto r = p.reattached().recover(never);
  BOOST_REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
  BOOST_REQUIRE(r->chains.size() == 2u);
  BOOST_TEST(r->chains[0].descs.size() == 2u);
  BOOST_TEST(r->chains[0].descs[0].addr == 0x1000u);
  BOOST_TEST(r->chains[0].descs[1].id == 4);
  BOOST_TEST(r->chains[1].descs.size() == 3u);
  BOOST_TEST(r->chains[1].descs[2].addr == 0x6000u);
  BOOST_TEST(r->used_idx == 1);
  BOOST_TEST(r->used_wrap);
  BOOST_TEST(r->avail_idx == 6);  // 1 used slot + 5 descriptors still in flight
  BOOST_TEST(r->avail_wrap);
}

BOOST_AUTO_TEST_CASE(packed_recover_finishes_a_push_that_reached_the_ring_and_undoes_one_that_did_not) {
  for (const bool reached : {true, false}) {
    Packed p;
    auto e1 = p.reg.on_pop(std::vector<PackedDescCopy>{d(0x1000, 0)});
    auto e2 = p.reg.on_pop(std::vector<PackedDescCopy>{d(0x2000, 1)});
    BOOST_REQUIRE(e1 && e2);
    p.reg.on_push_begin(*e1, 1, true);  // crashed here: used descriptor maybe written, not committed
    std::uint16_t asked = 0xffff;
    auto r = p.reattached().recover([&](std::uint16_t index, bool wrap) {
      asked = index;
      BOOST_TEST(wrap);
      return reached;
    });
    BOOST_REQUIRE(r);
    BOOST_TEST(asked == 0);  // the slot of the push under way
    BOOST_TEST(r->chains.size() == (reached ? 1u : 2u));
    BOOST_TEST(r->used_idx == (reached ? 1 : 0));
    BOOST_TEST(r->avail_idx == 2);
  }
}

BOOST_AUTO_TEST_CASE(packed_recover_drops_a_pop_that_never_committed) {
  Packed p;
  // A pop marks its head in flight before it commits by moving old_free_head.
  poke<std::uint8_t>(p.area.queue(0), entry(0) + kInflight, 1);
  poke<std::uint16_t>(p.area.queue(0), entry(0) + kNum, 1);
  auto r = p.reattached().recover(never);
  BOOST_REQUIRE(r);
  BOOST_TEST(r->chains.empty());
  BOOST_TEST(r->avail_idx == 0);
}

BOOST_AUTO_TEST_CASE(packed_recover_wraps_the_avail_position) {
  Packed p;
  p.reg.reset(14, false);
  auto e = p.reg.on_pop(std::vector<PackedDescCopy>{d(0x1000, 0, 1), d(0x2000, 0, 1), d(0x3000, 0, 0)});
  BOOST_REQUIRE(e);
  auto r = p.reattached().recover(never);
  BOOST_REQUIRE(r);
  BOOST_TEST(r->used_idx == 14);
  BOOST_TEST(!r->used_wrap);
  BOOST_TEST(r->avail_idx == 1);
  BOOST_TEST(r->avail_wrap);
}

BOOST_AUTO_TEST_CASE(packed_recover_refuses_an_inconsistent_area_with_a_sentence) {
  auto refused = [](auto corrupt) {
    Packed p;
    auto e1 = p.reg.on_pop(std::vector<PackedDescCopy>{d(0x1000, 0, kAvail | 1), d(0x2000, 0)});
    auto e2 = p.reg.on_pop(std::vector<PackedDescCopy>{d(0x3000, 1)});
    BOOST_REQUIRE(e1 && e2);
    corrupt(p.area.queue(0));
    auto r = p.reattached().recover(never);
    if (!r) {
      BOOST_TEST(r.error().is(Errc::protocol_error));
      BOOST_TEST(r.error().message.find("inconsistent") != std::string::npos);
    }
    return !r.ok();
  };
  using S = InflightRegion;
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, entry(0) + kNum, 0); }));       // in flight, no descriptors
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, entry(0) + kNum, 17); }));      // more than the ring
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, entry(0) + kNext, 16); }));     // link out of range
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, entry(0) + kNext, 0); }));      // loop onto itself
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, entry(0) + kNext, 2); }));      // into the other chain
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, entry(0) + kLast, 5); }));      // wrong last entry
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, kHdrUsed, 16); }));             // used index beyond the ring
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, kHdrOldUsed, 0xffff); }));
  BOOST_TEST(refused([](S s) { poke<std::uint16_t>(s, kHdrFreeHead, 17); }));
  BOOST_TEST(refused([](S s) {  // every entry claims the whole ring: more descriptors than slots
    for (std::uint16_t i = 3; i < 16; ++i) {
      poke<std::uint8_t>(s, entry(i) + kInflight, 1);
      poke<std::uint16_t>(s, entry(i) + kNum, 1);
      poke<std::uint16_t>(s, entry(i) + kLast, i);
    }
    poke<std::uint16_t>(s, entry(2) + kNum, 5);
  }));
  // Garbage in the inflight flag (neither 0 nor 1) just means "not in flight".
  BOOST_TEST(!refused([](S s) { poke<std::uint8_t>(s, entry(5) + kInflight, 7); }));
}

BOOST_AUTO_TEST_CASE(packed_tracking_stops_instead_of_writing_outside_a_corrupted_slice) {
  Packed p;
  poke<std::uint16_t>(p.area.queue(0), kHdrOldFreeHead, 0xfff0);
  BOOST_TEST(!p.reg.on_pop(std::vector<PackedDescCopy>{d(0x1000, 0)}).has_value());
  BOOST_TEST(!p.reg.attached());  // stopped: later calls do nothing
  p.reg.on_push_begin(0, 1, true);
  p.reg.on_push_end(0);
  Packed q;
  auto e = q.reg.on_pop(std::vector<PackedDescCopy>{d(0x1000, 0)});
  BOOST_REQUIRE(e);
  poke<std::uint16_t>(q.area.queue(0), entry(*e) + kLast, 0x8000);
  q.reg.on_push_begin(*e, 1, true);
  BOOST_TEST(!q.reg.attached());
  // A free list cut short by the frontend: the chain does not fit, tracking stops.
  Packed r;
  poke<std::uint16_t>(r.area.queue(0), entry(0) + kNext, 0x4000);
  BOOST_TEST(!r.reg.on_pop(std::vector<PackedDescCopy>{d(0x1000, 0, kAvail | 1), d(0x2000, 0)}).has_value());
  BOOST_TEST(!r.reg.attached());
}
