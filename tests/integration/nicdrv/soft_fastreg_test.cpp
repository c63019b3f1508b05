// Fast registration on the soft engine (IBA 10.6.3.4, 10.6.4.4; what the kernel's NVMe-oF and
// iSER initiators do for every I/O): a region from alloc_mr holds nothing until a REG_MR work
// request gives it memory, rights and a key; LOCAL_INV (or a peer's SEND with Invalidate) ends
// it; both run in order on the send queue and complete there. Two engines on loopback, data
// checked at the target.
#define BOOST_TEST_MODULE soft_fastreg
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "soft_pair.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using namespace vrdma::test::soft_pair;
using vrdma::test::Endpoint;

namespace {

constexpr Access kRemoteRw = Access::local_write | Access::remote_write | Access::remote_read;

std::shared_ptr<MemoryRegion> alloc(Endpoint& e, std::uint32_t pages) {
  auto mr = e.pd->alloc_mr(pages);
  VRDMA_REQUIRE_OK(mr);
  return std::move(*mr);
}

// REG_MR of `mr`: `len` bytes at host `addr`, named from `iova`, 4 KiB pages, key byte `byte`.
SendWr reg_of(std::uint64_t id, MemoryRegion& mr, void* addr, std::uint64_t iova, std::uint64_t len, std::uint8_t byte,
              Access acc = kRemoteRw) {
  SendWr w = wr_of(WrOpcode::reg_mr, id, nullptr, 0);
  w.reg.mr = &mr;
  w.reg.addr = addr;
  w.reg.iova = iova;
  w.reg.length = len;
  w.reg.access = acc;
  w.reg.key = (mr.lkey() & ~0xffu) | byte;
  return w;
}

SendWr inv_of(std::uint64_t id, std::uint32_t key) {
  SendWr w = wr_of(WrOpcode::local_inv, id, nullptr, 0);
  w.invalidate_rkey = key;
  return w;
}

// A's WRITE (or READ) of `len` bytes of its buffer at `off` to B's `va` under `rkey`; its status.
WcStatus remote(Pair& p, WrOpcode op, std::uint64_t id, std::size_t off, std::uint32_t len, std::uint64_t va,
                std::uint32_t rkey) {
  Sge s = p.sge(p.a, off, len);
  auto w = wr_of(op, id, &s, 1);
  w.rdma.remote_addr = va;
  w.rdma.rkey = rkey;
  post_send(p.a, w);
  return one(p.a).status;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_soft_engine_offers_fast_registration) {
  Pair p;
  auto a = p.b.dev->query_device();
  VRDMA_REQUIRE_OK(a);
  BOOST_TEST(a->max_fast_reg_pages == 512u);
  BOOST_TEST(p.b.pd->alloc_mr(0).error().is(Errc::invalid_argument));
  BOOST_TEST(p.b.pd->alloc_mr(513).error().is(Errc::invalid_argument));
  MrOptions keyed;
  keyed.requested_key = 0x1234;
  BOOST_TEST(p.b.pd->alloc_mr(4, keyed).error().is(Errc::invalid_argument));
  // Two regions hold key blocks of their own; neither names anything yet.
  auto m1 = alloc(p.b, 4), m2 = alloc(p.b, 4);
  BOOST_TEST((m1->lkey() >> 8) != (m2->lkey() >> 8));
  BOOST_TEST((m1->lkey() & 0xffu) == 0u);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 1, 0, 64, 0x1000, m1->rkey()) == WcStatus::rem_access_err);
}

// REG_MR, then the peer WRITEs and READs through the new key at the region's iova (which starts
// 100 bytes into its first page), then LOCAL_INV: the key names nothing and the bytes stay.
BOOST_AUTO_TEST_CASE(reg_mr_gives_memory_rights_and_a_key_and_local_inv_takes_them_away) {
  Pair p;
  auto mr = alloc(p.b, 4);
  std::vector<std::uint8_t> target(3 * 4096, 0);
  const std::uint64_t iova = 0x7f0000100064;  // 100 bytes into a page
  const std::uint32_t len = 8000;              // pages 0..1 of the region
  post_send(p.b, reg_of(10, *mr, target.data(), iova, len, 0x5a));
  const auto rc = one(p.b);
  BOOST_TEST(rc.status == WcStatus::success);
  BOOST_TEST(rc.opcode == WcOpcode::reg_mr);
  BOOST_TEST(rc.wr_id == 10u);
  const std::uint32_t key = mr->rkey();
  BOOST_TEST((key & 0xffu) == 0x5au);
  BOOST_TEST(mr->lkey() == key);
  BOOST_TEST(mr->addr() == iova);
  BOOST_TEST(mr->length() == len);

  for (std::uint32_t i = 0; i < len; ++i) p.a.buf[i] = static_cast<std::uint8_t>(i * 13 + 5);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 1, 0, len, iova, key) == WcStatus::success);
  BOOST_TEST(std::equal(target.begin(), target.begin() + len, p.a.buf.begin()));
  // A READ of the middle lands in A's buffer at 65536.
  BOOST_TEST(remote(p, WrOpcode::rdma_read, 2, 65536, 3000, iova + 1000, key) == WcStatus::success);
  BOOST_TEST(std::equal(target.begin() + 1000, target.begin() + 4000, p.a.buf.begin() + 65536));
  // Past the region's end: refused.
  BOOST_TEST(remote(p, WrOpcode::rdma_read, 3, 65536, 64, iova + len - 32, key) == WcStatus::rem_access_err);
}

BOOST_AUTO_TEST_CASE(local_inv_ends_the_region_and_a_later_reg_mr_gives_it_a_new_key) {
  Pair p;
  auto mr = alloc(p.b, 2);
  std::vector<std::uint8_t> t1(4096, 0), t2(4096, 0);
  post_send(p.b, reg_of(1, *mr, t1.data(), 0x10000, 4096, 0x01));
  BOOST_TEST(one(p.b).status == WcStatus::success);
  const std::uint32_t k1 = mr->rkey();
  std::memset(p.a.buf.data(), 0xa1, 512);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 1, 0, 512, 0x10000, k1) == WcStatus::success);
  BOOST_TEST(t1[511] == 0xa1);
  // LOCAL_INV and a REG_MR over other memory under the next key byte, posted together: they run
  // in order.
  const std::vector<SendWr> batch = {inv_of(2, k1), reg_of(3, *mr, t2.data(), 0x20000, 4096, 0x02)};
  VRDMA_REQUIRE_OK(p.b.qp->post_send(batch));
  const auto cs = test::wait_cq(*p.b.cq, 2);
  BOOST_REQUIRE_EQUAL(cs.size(), 2u);
  const auto &c1 = cs[0], &c2 = cs[1];
  BOOST_TEST(c1.wr_id == 2u);
  BOOST_TEST(c1.opcode == WcOpcode::local_inv);
  BOOST_TEST(c1.status == WcStatus::success);
  BOOST_TEST(c2.wr_id == 3u);
  BOOST_TEST(c2.status == WcStatus::success);
  const std::uint32_t k2 = mr->rkey();
  BOOST_TEST(k2 == ((k1 & ~0xffu) | 0x02u));
  std::memset(p.a.buf.data(), 0xb2, 512);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 4, 0, 512, 0x20000, k2) == WcStatus::success);
  BOOST_TEST(t2[0] == 0xb2);
  BOOST_TEST(t1[0] == 0xa1);
  auto st = soft::stats(*p.b.dev);
  VRDMA_REQUIRE_OK(st);
  BOOST_TEST(st->fast_registrations == 2u);
  BOOST_TEST(st->local_invalidations == 1u);
  // The old key names nothing: A's WRITE by it is a remote access error, and t1 keeps its bytes.
  std::memset(p.a.buf.data(), 0xcc, 512);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 5, 0, 512, 0x10000, k1) == WcStatus::rem_access_err);
  BOOST_TEST(t1[0] == 0xa1);
}

// nvmet-rdma's way: the target's SEND with Invalidate ends the initiator's fast region (no
// LOCAL_INV needed), which may then be registered again.
BOOST_AUTO_TEST_CASE(a_peers_send_with_invalidate_ends_a_fast_region) {
  Pair p;
  auto mr = alloc(p.b, 1);
  std::vector<std::uint8_t> t(4096, 0);
  post_send(p.b, reg_of(1, *mr, t.data(), 0x30000, 4096, 0x07));
  BOOST_TEST(one(p.b).status == WcStatus::success);
  const std::uint32_t key = mr->rkey();
  post_recv(p.b, 50, p.sge(p.b, 0, 4096));
  Sge m = p.sge(p.a, 0, 100);
  auto inv = wr_of(WrOpcode::send_with_inv, 2, &m, 1);
  inv.invalidate_rkey = key;
  post_send(p.a, inv);
  BOOST_TEST(one(p.a).status == WcStatus::success);
  const auto rb = one(p.b);
  BOOST_TEST(rb.status == WcStatus::success);
  BOOST_TEST(rb.invalidated_rkey == key);
  // Invalid now, so REG_MR takes it again.
  post_send(p.b, reg_of(3, *mr, t.data(), 0x30000, 4096, 0x08));
  BOOST_TEST(one(p.b).status == WcStatus::success);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 4, 0, 100, 0x30000, mr->rkey()) == WcStatus::success);
  BOOST_TEST(std::equal(t.begin(), t.begin() + 100, p.a.buf.begin()));
}

// What post_send refuses at once, and what completes in error when it runs (the QP then goes to
// ERR, as in Linux rxe: local QP operation error).
BOOST_AUTO_TEST_CASE(bad_registrations_are_refused) {
  {
    Pair p;
    auto mr = alloc(p.b, 2);
    std::vector<std::uint8_t> t(16384);
    auto bad_key = reg_of(1, *mr, t.data(), 0x1000, 4096, 1);
    bad_key.reg.key ^= 0x100;  // another region's block
    auto st = p.b.qp->post_send(std::span(&bad_key, 1));
    BOOST_REQUIRE(!st.ok());
    BOOST_TEST(st.error().is(Errc::invalid_argument));
    BOOST_TEST(st.error().message.find("low 8 bits") != std::string::npos, st.error().message);
    auto too_long = reg_of(2, *mr, t.data(), 0x1800, 8192, 1);  // 3 pages from 0x1000's page
    st = p.b.qp->post_send(std::span(&too_long, 1));
    BOOST_REQUIRE(!st.ok());
    BOOST_TEST(st.error().message.find("made for 2") != std::string::npos, st.error().message);
    auto plain = reg_of(3, *p.b.mr, t.data(), 0x1000, 4096, 1);
    BOOST_TEST(!p.b.qp->post_send(std::span(&plain, 1)).ok());
    auto rights = reg_of(4, *mr, t.data(), 0x1000, 4096, 1, Access::remote_write);
    BOOST_TEST(!p.b.qp->post_send(std::span(&rights, 1)).ok());
    // None of them ran: the region registers fine.
    post_send(p.b, reg_of(5, *mr, t.data(), 0x1000, 4096, 1));
    BOOST_TEST(one(p.b).status == WcStatus::success);
    // A second REG_MR of a valid region: error completion, QP to ERR.
    post_send(p.b, reg_of(6, *mr, t.data(), 0x1000, 4096, 2));
    const auto c = one(p.b);
    BOOST_TEST(c.wr_id == 6u);
    BOOST_TEST(c.status == WcStatus::loc_qp_op_err);
    BOOST_TEST(p.b.qp->state() == QpState::err);
    BOOST_TEST((mr->rkey() & 0xffu) == 1u);
  }
  {
    // LOCAL_INV of a plainly registered region, or of a key that names nothing: error
    // completion.
    Pair p;
    post_send(p.b, inv_of(7, p.b.mr->lkey()));
    BOOST_TEST(one(p.b).status == WcStatus::loc_qp_op_err);
    Pair q;
    post_send(q.b, inv_of(8, 0xdead00));
    BOOST_TEST(one(q.b).status == WcStatus::loc_qp_op_err);
    auto st = soft::stats(*q.b.dev);
    VRDMA_REQUIRE_OK(st);
    BOOST_TEST(st->local_invalidations == 0u);
  }
}

// A region carried over a migration (MrOptions::requested_key and registered, what vrdmad's
// device state loads): it takes the whole requested key, starts valid over the given memory
// (A WRITEs through it at once), ends at a LOCAL_INV and registers again under its block;
// requested keys that are no free fast key, and registrations without a key, are refused.
BOOST_AUTO_TEST_CASE(a_region_made_as_a_migrations_source_left_it) {
  Pair p;
  auto first = alloc(p.b, 4);
  const std::uint32_t moved_key = (first->lkey() + 0x300) | 0x5c;  // a free block, a used low byte
  std::vector<std::uint8_t> target(16384, 0);
  MrOptions mo;
  mo.requested_key = moved_key;
  mo.registered = MrOptions::Registered{target.data() + 100, 0x9000 + 100, 12000, kRemoteRw};
  auto mr = p.b.pd->alloc_mr(4, mo);
  VRDMA_REQUIRE_OK(mr);
  BOOST_TEST((*mr)->lkey() == moved_key);
  BOOST_TEST((*mr)->valid());
  BOOST_TEST((*mr)->addr() == 0x9000u + 100);
  BOOST_TEST((*mr)->length() == 12000u);
  test::fill_pattern(p.a.buf.data(), 12000, 5);
  BOOST_TEST(remote(p, WrOpcode::rdma_write, 1, 0, 12000, 0x9000 + 100, moved_key) == WcStatus::success);
  BOOST_TEST(test::check_pattern(target.data() + 100, 12000, 5));
  post_send(p.b, inv_of(2, moved_key));
  BOOST_TEST(one(p.b).status == WcStatus::success);
  BOOST_TEST(!(*mr)->valid());
  post_send(p.b, reg_of(3, **mr, target.data(), 0x1000, 4096, 0x5d));
  BOOST_TEST(one(p.b).status == WcStatus::success);
  BOOST_TEST((*mr)->lkey() == ((moved_key & ~0xffu) | 0x5d));
  // An invalid one keeps its key as it was.
  MrOptions idle;
  idle.requested_key = (first->lkey() + 0x400) | 0x11;
  auto quiet = p.b.pd->alloc_mr(2, idle);
  VRDMA_REQUIRE_OK(quiet);
  BOOST_TEST((*quiet)->lkey() == idle.requested_key);
  BOOST_TEST(!(*quiet)->valid());
  // Refused: a key in another region's block, a plain region's key, a registration without a key.
  MrOptions taken;
  taken.requested_key = first->lkey() | 0x01;
  auto t = p.b.pd->alloc_mr(2, taken);
  BOOST_REQUIRE(!t.ok());
  BOOST_TEST(t.error().message.find("no free fast-registration key") != std::string::npos, t.error().message);
  BOOST_TEST(t.error().is(Errc::busy));
  MrOptions plain;
  plain.requested_key = p.b.mr->lkey();
  auto pl = p.b.pd->alloc_mr(2, plain);
  BOOST_REQUIRE(!pl.ok());
  BOOST_TEST(pl.error().is(Errc::invalid_argument));
  MrOptions keyless;
  keyless.registered = MrOptions::Registered{target.data(), 0x1000, 4096, kRemoteRw};
  auto k = p.b.pd->alloc_mr(2, keyless);
  BOOST_REQUIRE(!k.ok());
  BOOST_TEST(k.error().is(Errc::invalid_argument));
}
