// Device-side rings against our driver-side queues, in one GuestRam (no processes).
#define BOOST_TEST_MODULE vhost_virtqueue
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/guest_ram.hpp"
#include "vrdma/vhost/virtqueue.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {

struct Rig {
  GuestRam ram = std::move(GuestRam::create(GuestRam::vm_layout(16)).value());
  GuestView view;
  Rig() {
    std::vector<GuestMemory::RegionPtr> v;
    for (const auto& r : ram.table()) v.push_back(MappedRegion::wrap(r, ram.host(r.guest_phys_addr, r.memory_size)));
    view = GuestView(GuestMemory::build(v).value(), nullptr);
  }
  std::unique_ptr<Ring> ring(const DriverQueue& q, bool event_idx, bool indirect, std::uint32_t base) {
    RingSetup s{q.size(), q.desc_gpa(), q.driver_gpa(), q.device_gpa(), q.packed(), event_idx, indirect};
    auto r = make_ring(s, base, view, InflightRegion{});
    BOOST_REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
    return std::move(*r);
  }
  std::uint64_t buf(std::uint64_t len) { return ram.alloc(len, 16).value(); }
};

struct RawDesc {
  std::uint64_t addr;
  std::uint32_t len;
  std::uint16_t flags, next;
};

void publish_split(Rig& r, DriverQueue& q, std::uint16_t head) {
  auto* avail = r.ram.host(q.driver_gpa(), 4 + 2u * q.size());
  std::uint16_t idx;
  std::memcpy(&idx, avail + 2, 2);
  std::memcpy(avail + 4 + 2 * (idx % q.size()), &head, 2);
  ++idx;
  std::memcpy(avail + 2, &idx, 2);
}

std::string pop_error(Rig& r, Ring& ring) {
  auto c = ring.pop(r.view);
  BOOST_REQUIRE(!c.ok());
  BOOST_TEST(ring.broken());
  return c.error().message;
}

}  // namespace

BOOST_AUTO_TEST_CASE(split_chain_roundtrip_direct_and_indirect) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 16, false, false).value();
  auto ring = r.ring(q, false, true, 0);
  const auto h = r.buf(16), d = r.buf(1000), s = r.buf(1);
  for (bool indirect : {false, true}) {
    std::vector<DriverBuf> bufs{{h, 16, false}, {d, 1000, true}, {s, 1, true}};
    auto id = q.add(bufs, indirect);
    BOOST_REQUIRE(id);
    q.publish();
    auto c = ring->pop(r.view);
    BOOST_REQUIRE(c && c->has_value());
    BOOST_TEST((*c)->id == *id);
    BOOST_TEST((*c)->readable == 16u);
    BOOST_TEST((*c)->writable == 1001u);
    ChainWriter w(r.view, **c);
    std::vector<std::uint8_t> data(1001, 0x5a);
    BOOST_REQUIRE(w.write(data.data(), data.size()).ok());
    BOOST_TEST(!w.write(data.data(), 1).ok());  // no room left
    BOOST_REQUIRE(ring->push(r.view, **c, 1001).ok());
    auto u = q.get_used();
    BOOST_REQUIRE(u);
    BOOST_TEST(u->id == *id);
    BOOST_TEST(u->len == 1001u);
    BOOST_TEST(*r.ram.host(d + 999, 1) == 0x5a);
    BOOST_TEST(*r.ram.host(s, 1) == 0x5a);
    BOOST_TEST(!ring->pop(r.view).value().has_value());
  }
  BOOST_TEST(ring->base() == 2u);
}

BOOST_AUTO_TEST_CASE(split_chain_rules) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 16, false, false).value();
  auto* d = reinterpret_cast<RawDesc*>(r.ram.host(q.desc_gpa(), 16 * 16));
  const auto b = r.buf(4096);
  struct Case {
    std::vector<RawDesc> descs;
    bool indirect_ok;
    const char* error;
  };
  const auto t = r.buf(16 * 2000);
  auto* table = reinterpret_cast<RawDesc*>(r.ram.host(t, 16 * 2000));
  for (int i = 0; i < 2000; ++i) table[i] = {b, 1, 1, static_cast<std::uint16_t>(i + 1)};
  std::vector<Case> cases{
      {{{b, 1, 1, 1}, {b, 1, 1, 0}}, false, "loops"},
      {{{b, 1, 1, 40}}, false, "outside a queue of 16"},
      {{{b, 1, 2 | 1, 1}, {b, 1, 0, 0}}, false, "readable descriptor after a writable one"},
      {{{t, 16 * 2000, 4, 0}}, true, "at most 1024"},
      {{{t, 16, 4, 0}}, false, "not negotiated"},
      {{{t, 17, 4, 0}}, true, "not a multiple of 16"},
      {{{0xb0000, 16, 4, 0}}, true, "indirect table"},
      {{{0xb0000, 16, 0, 0}}, false, "outside guest memory"},
      {{{b, 16, 4 | 1, 1}, {b, 1, 0, 0}}, true, "only descriptor"},
      {{{UINT64_MAX - 4, 16, 0, 0}}, false, "wraps"},
  };
  for (const auto& c : cases) {
    for (std::size_t i = 0; i < c.descs.size(); ++i) d[i] = c.descs[i];
    auto ring = r.ring(q, false, c.indirect_ok, 0);
    publish_split(r, q, 0);
    const std::string e = pop_error(r, *ring);
    BOOST_TEST(e.find(c.error) != std::string::npos, e << " (wanted " << c.error << ")");
    BOOST_TEST(!ring->pop(r.view).value().has_value());  // broken: does nothing more
    BOOST_TEST(!ring->push(r.view, DescChain{}, 0).ok());
    // Reset the avail index for the next case.
    std::memset(r.ram.host(q.driver_gpa(), 4), 0, 4);
  }
  // An indirect table that loops through `next` is caught too.
  table[0] = {b, 1, 1, 1};
  table[1] = {b, 1, 1, 0};
  d[0] = {t, 32, 4, 0};
  auto ring = r.ring(q, false, true, 0);
  publish_split(r, q, 0);
  BOOST_TEST(pop_error(r, *ring).find("indirect descriptor chain loops") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(avail_index_running_ahead_of_the_queue_is_an_error) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 8, false, false).value();
  auto ring = r.ring(q, false, false, 0);
  const std::uint16_t idx = 9;
  std::memcpy(r.ram.host(q.driver_gpa() + 2, 2), &idx, 2);
  BOOST_TEST(pop_error(r, *ring).find("more than the queue size") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(layout_is_checked_before_a_ring_starts) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 16, false, false).value();
  auto bad = [&](RingSetup s) { return !make_ring(s, 0, r.view, InflightRegion{}).ok(); };
  RingSetup ok{16, q.desc_gpa(), q.driver_gpa(), q.device_gpa(), false, false, false};
  BOOST_TEST(!bad(ok));
  RingSetup s = ok;
  s.size = 12;  // split needs a power of two
  BOOST_TEST(bad(s));
  s = ok;
  s.desc += 8;
  BOOST_TEST(bad(s));
  s = ok;
  s.device = 0xa0000;  // in the hole
  BOOST_TEST(bad(s));
  s = ok;
  s.driver = 640 * 1024 - 8;  // runs off region 0
  BOOST_TEST(bad(s));
  s = ok;
  s.packed = true;
  BOOST_TEST(!make_ring(s, 0x8000 | 20, r.view, InflightRegion{}).ok());  // base beyond size
  BOOST_TEST(!make_ring(s, 0x8000 | (20u << 16), r.view, InflightRegion{}).ok());  // used half beyond size
}

BOOST_AUTO_TEST_CASE(split_event_idx_suppresses_kicks_and_interrupts) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 16, false, true).value();
  auto ring = r.ring(q, true, false, 0);
  const auto b = r.buf(64);
  std::vector<DriverBuf> bufs{{b, 16, false}, {b + 16, 16, true}};
  BOOST_REQUIRE(q.add(bufs));
  q.publish();
  BOOST_TEST(q.needs_kick());  // avail_event 0: the first entry wants a kick
  auto c = ring->pop(r.view).value();
  BOOST_REQUIRE(c);
  BOOST_TEST(!ring->pop(r.view).value().has_value());  // empty: device asks for a kick at 1
  BOOST_REQUIRE(ring->push(r.view, *c, 0).ok());
  // The driver has not set used_event past 0 yet, so the first used entry interrupts...
  BOOST_TEST(ring->should_notify(r.view).value());
  BOOST_REQUIRE(q.get_used());  // ...and consuming it moves used_event to 1.
  BOOST_REQUIRE(q.add(bufs));
  q.publish();
  BOOST_TEST(q.needs_kick());
  BOOST_REQUIRE(q.add(bufs));
  q.publish();
  BOOST_TEST(!q.needs_kick());  // device has not consumed the previous kick's entry
  auto c1 = ring->pop(r.view).value();
  auto c2 = ring->pop(r.view).value();
  BOOST_REQUIRE(c1 && c2);
  BOOST_REQUIRE(ring->push(r.view, *c1, 0).ok());
  BOOST_TEST(ring->should_notify(r.view).value());  // used_event 1 passed
  BOOST_REQUIRE(ring->push(r.view, *c2, 0).ok());
  BOOST_TEST(!ring->should_notify(r.view).value());  // driver has not consumed: no new event
}

BOOST_AUTO_TEST_CASE(split_without_event_idx_honours_no_interrupt) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 16, false, false).value();
  auto ring = r.ring(q, false, false, 0);
  const auto b = r.buf(64);
  std::vector<DriverBuf> bufs{{b, 16, true}};
  BOOST_REQUIRE(q.add(bufs));
  q.publish();
  auto c = ring->pop(r.view).value();
  BOOST_REQUIRE(ring->push(r.view, *c, 0).ok());
  const std::uint16_t no_interrupt = 1;
  std::memcpy(r.ram.host(q.driver_gpa(), 2), &no_interrupt, 2);
  BOOST_TEST(!ring->should_notify(r.view).value());
}

BOOST_AUTO_TEST_CASE(packed_ring_wraps_many_times_with_mixed_chains) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 7, true, false).value();
  auto ring = r.ring(q, false, true, 0x80008000);
  const auto b = r.buf(8 * 64);
  for (int round = 0; round < 500; ++round) {
    const std::size_t n = 1 + round % 3;
    std::vector<DriverBuf> bufs;
    for (std::size_t k = 0; k < n; ++k) bufs.push_back({b + k * 64, 64, k + 1 == n});
    const bool indirect = round % 5 == 0;
    auto id = q.add(bufs, indirect);
    BOOST_REQUIRE(id);
    auto c = ring->pop(r.view);
    BOOST_REQUIRE_MESSAGE(c && c->has_value(), (c ? "empty" : c.error().message));
    BOOST_TEST((*c)->id == *id);
    BOOST_TEST((*c)->bufs.size() == n);
    BOOST_TEST((*c)->slots == (indirect ? 1u : n));
    BOOST_REQUIRE(ring->push(r.view, **c, static_cast<std::uint32_t>(round)).ok());
    auto u = q.get_used();
    BOOST_REQUIRE(u);
    BOOST_TEST(u->id == *id);
    BOOST_TEST(u->len == static_cast<std::uint32_t>(round));
    BOOST_TEST(!ring->pop(r.view).value().has_value());
  }
  // Base encodes the wrap counter in bit 15, and a ring restarted there continues.
  BOOST_TEST((ring->base() >> 16) == (ring->base() & 0xffffu));  // all used: used state == avail state
  auto again = r.ring(q, false, true, ring->base());
  std::vector<DriverBuf> one{{b, 64, true}};
  BOOST_REQUIRE(q.add(one));
  BOOST_TEST(again->pop(r.view).value().has_value());
}

BOOST_AUTO_TEST_CASE(packed_event_suppression) {
  Rig r;
  auto q = DriverQueue::create(r.ram, 8, true, true).value();
  auto ring = r.ring(q, true, false, 0x80008000);
  const auto b = r.buf(64);
  std::vector<DriverBuf> bufs{{b, 16, true}};
  BOOST_REQUIRE(q.add(bufs));
  auto c = ring->pop(r.view).value();
  BOOST_REQUIRE(ring->push(r.view, *c, 0).ok());
  BOOST_TEST(ring->should_notify(r.view).value());  // flags ENABLE
  BOOST_REQUIRE(q.get_used());                       // driver now asks for an event at index 1
  BOOST_REQUIRE(q.add(bufs));
  BOOST_REQUIRE(q.add(bufs));
  auto c1 = ring->pop(r.view).value();
  auto c2 = ring->pop(r.view).value();
  BOOST_REQUIRE(ring->push(r.view, *c1, 0).ok());
  BOOST_TEST(ring->should_notify(r.view).value());
  BOOST_REQUIRE(ring->push(r.view, *c2, 0).ok());
  BOOST_TEST(!ring->should_notify(r.view).value());
  const std::uint16_t disable = 1;
  std::memcpy(r.ram.host(q.driver_gpa() + 2, 2), &disable, 2);
  BOOST_REQUIRE(q.add(bufs));
  auto c3 = ring->pop(r.view).value();
  BOOST_REQUIRE(ring->push(r.view, *c3, 0).ok());
  BOOST_TEST(!ring->should_notify(r.view).value());
}

BOOST_AUTO_TEST_CASE(driver_queue_stops_at_a_used_id_the_device_does_not_own) {
  // The driver does not trust the device (libpvverbs inside a VM): a used entry naming a buffer
  // it never posted, or returning one twice, must not corrupt its free list.
  for (const std::uint32_t bad_id : {5u, 0u, 1000u}) {
    Rig r;
    auto q = DriverQueue::create(r.ram, 16, false, false).value();
    auto ring = r.ring(q, false, false, 0);
    const auto b = r.buf(64);
    std::vector<DriverBuf> bufs{{b, 16, true}};
    const auto id = q.add(bufs).value();
    BOOST_REQUIRE_EQUAL(id, 0u);
    q.publish();
    auto c = ring->pop(r.view).value();
    BOOST_REQUIRE(ring->push(r.view, *c, 7).ok());
    auto u = q.get_used();
    BOOST_REQUIRE(u);
    BOOST_TEST(u->len == 7u);
    BOOST_TEST(q.free_slots() == 16u);
    // A forged used entry: id 5 was never posted, id 0 was already returned, 1000 is out of range.
    auto* used = r.ram.host(q.device_gpa(), 4 + 8u * 16);
    std::uint16_t idx;
    std::memcpy(&idx, used + 2, 2);
    std::memcpy(used + 4 + 8 * (idx % 16), &bad_id, 4);
    ++idx;
    std::memcpy(used + 2, &idx, 2);
    BOOST_TEST(!q.get_used().has_value());
    BOOST_TEST(q.broken());
    BOOST_TEST(q.free_slots() == 16u);
    BOOST_TEST(!q.get_used().has_value());
  }
}

// A device polling a ring turns kicks off (Ring::set_notification); the driver's needs_kick()
// sees it, on every layout. With EVENT_IDX the device only stops moving avail_event, so one
// kick may still come (the entry that passes the last event); without it, none. Turned back
// on, the next entry kicks again, and a ring restarted over memory a polling device left with
// kicks off starts with them on.
BOOST_AUTO_TEST_CASE(kicks_off_while_the_device_polls_and_back_on) {
  struct Layout {
    bool packed, event_idx;
  };
  for (const Layout l : {Layout{false, false}, Layout{false, true}, Layout{true, false}, Layout{true, true}}) {
    BOOST_TEST_CONTEXT((l.packed ? "packed" : "split") << (l.event_idx ? " event_idx" : "")) {
      Rig r;
      auto q = DriverQueue::create(r.ram, 16, l.packed, l.event_idx).value();
      auto ring = r.ring(q, l.event_idx, false, l.packed ? 0x80008000 : 0);
      const auto b = r.buf(64);
      std::vector<DriverBuf> bufs{{b, 16, true}};
      auto post = [&] {
        BOOST_REQUIRE(q.add(bufs));
        q.publish();
        return q.needs_kick();
      };
      auto drain = [&] {
        int n = 0;
        for (;;) {
          auto c = ring->pop(r.view);
          BOOST_REQUIRE(c);
          if (!c->has_value()) return n;
          BOOST_REQUIRE(ring->push(r.view, **c, 0).ok());
          BOOST_REQUIRE(q.get_used());
          ++n;
        }
      };
      BOOST_TEST(post());  // kicks on at the start
      BOOST_TEST(drain() == 1);
      BOOST_REQUIRE(ring->set_notification(r.view, false).ok());
      BOOST_REQUIRE(ring->set_notification(r.view, false).ok());  // idempotent
      int kicks = 0;
      for (int i = 0; i < 40; ++i) {  // the polling device takes each entry as it comes
        kicks += post() ? 1 : 0;
        BOOST_TEST(drain() == 1);
      }
      BOOST_TEST(kicks <= (l.event_idx && !l.packed ? 1 : 0));
      BOOST_REQUIRE(ring->set_notification(r.view, true).ok());
      BOOST_TEST(drain() == 0);
      BOOST_TEST(post());  // on again: the next entry kicks
      BOOST_TEST(drain() == 1);

      BOOST_REQUIRE(ring->set_notification(r.view, false).ok());
      auto again = r.ring(q, l.event_idx, false, ring->base());  // a new backend over the same memory
      BOOST_TEST(drain() == 0);
      ring = std::move(again);
      BOOST_TEST(drain() == 0);
      BOOST_TEST(post());
      BOOST_TEST(drain() == 1);
    }
  }
}

// A driver that reaps a queue as it posts turns its interrupts off (DriverQueue::set_interrupts,
// libpvverbs' doorbell queue): the device's should_notify() then says no for every used entry,
// on every layout, however far the ring runs (past a wrap of the 16-bit indices with
// EVENT_IDX); turned back on, the next used entry interrupts again.
BOOST_AUTO_TEST_CASE(interrupts_off_while_the_driver_reaps_as_it_posts_and_back_on) {
  struct Layout {
    bool packed, event_idx;
  };
  for (const Layout l : {Layout{false, false}, Layout{false, true}, Layout{true, false}, Layout{true, true}}) {
    BOOST_TEST_CONTEXT((l.packed ? "packed" : "split") << (l.event_idx ? " event_idx" : "")) {
      Rig r;
      auto q = DriverQueue::create(r.ram, 16, l.packed, l.event_idx).value();
      auto ring = r.ring(q, l.event_idx, false, l.packed ? 0x80008000 : 0);
      const auto b = r.buf(64);
      std::vector<DriverBuf> bufs{{b, 16, true}};
      // One entry through the ring: the device's verdict on interrupting for it.
      auto round = [&] {
        BOOST_REQUIRE(q.add(bufs));
        q.publish();
        auto c = ring->pop(r.view).value();
        BOOST_REQUIRE(c);
        BOOST_REQUIRE(ring->push(r.view, *c, 0).ok());
        const bool notify = ring->should_notify(r.view).value();
        BOOST_REQUIRE(q.get_used());
        return notify;
      };
      BOOST_TEST(round());  // on at the start
      q.set_interrupts(false);
      int interrupts = 0;
      for (int i = 0; i < 70000; ++i) interrupts += round() ? 1 : 0;  // past a wrap of the indices
      BOOST_TEST(interrupts == 0);
      q.set_interrupts(true);
      BOOST_TEST(round());
      BOOST_TEST(round());
    }
  }
}
