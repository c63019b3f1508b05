// Bad input from an untrusted frontend: each gets a clear error in the backend's log, the
// backend process stays up and keeps serving, and nothing is written outside guest memory.
#define BOOST_TEST_MODULE vhost_bad_input
#include <boost/test/unit_test.hpp>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "blk_client.hpp"
#include "process.hpp"

using namespace vrdma;
using namespace vrdma::test;
using namespace vrdma::vhost;

namespace {

struct Fixture {
  TempDir dir;
  std::string sock = dir.file("blk.sock");
  std::string log = dir.file("backend.log");
  Child child{{VHOST_BLK_BACKEND, "--socket", sock, "--disk", dir.file("disk.img"), "--size-mib", "8", "--queues", "2"},
              log};
  Fixture() { BOOST_REQUIRE(wait_for_path(sock, 5000)); }
  ~Fixture() { child.stop(SIGTERM); }

  // A frontend that negotiated REPLY_ACK, so every refused request gets a non-zero ack.
  Frontend fresh() {
    auto f = Frontend::connect(sock);
    BOOST_REQUIRE(f);
    auto acked = f->negotiate({VirtioFeature::version_1, VirtioFeature::protocol_features},
                              {ProtocolFeature::reply_ack, ProtocolFeature::mq, ProtocolFeature::config,
                               ProtocolFeature::configure_mem_slots, ProtocolFeature::log_shmfd});
    BOOST_REQUIRE(acked);
    return std::move(*f);
  }
  // The backend answers a well-formed GET_FEATURES on the same connection (when it is still
  // open) or on a new one (after the bad input closed it): it is up and serving.
  void still_serving(Frontend* same = nullptr) {
    BOOST_REQUIRE(child.alive());
    std::optional<Frontend> fresh_conn;
    if (same == nullptr) {
      auto f = Frontend::connect(sock);
      BOOST_REQUIRE(f);
      fresh_conn.emplace(std::move(*f));
      same = &*fresh_conn;
    }
    auto r = same->request(make_request(Request::get_features));
    BOOST_REQUIRE_MESSAGE(r && r->has_value(), "backend stopped answering; log:\n" + read_file(log));
  }
  bool logged(const std::string& s) {
    for (int i = 0; i < 400; ++i) {
      if (read_file(log).find(s) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    BOOST_TEST_MESSAGE("log was:\n" << read_file(log));
    return false;
  }
};

// Sends a request and expects it refused (non-zero REPLY_ACK) on a live connection.
void expect_nack(Frontend& f, Message m) {
  auto r = f.request(std::move(m));
  BOOST_REQUIRE(!r);
  BOOST_TEST(r.error().message.find("backend refused") != std::string::npos, r.error().message);
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(bad_input, Fixture)

BOOST_AUTO_TEST_CASE(unknown_request_is_refused_and_the_session_continues) {
  auto f = fresh();
  Message m = make_request(Request::get_features);
  m.hdr.request = 999;
  m.hdr.flags |= kFlagNeedReply;
  BOOST_REQUIRE(f.channel().send(m).ok());
  auto r = f.channel().recv();
  BOOST_REQUIRE(r);
  BOOST_TEST(r->get<std::uint64_t>() != 0u);
  BOOST_TEST(logged("unknown request number 999"));
  BOOST_TEST(f.get_queue_num().ok());  // same connection still works
}

BOOST_AUTO_TEST_CASE(oversize_payload_drops_the_connection_not_the_backend) {
  auto f = fresh();
  Header h{static_cast<std::uint32_t>(Request::set_features), kVersion, 4096};
  std::vector<std::uint8_t> buf(sizeof h + 4096, 0);
  std::memcpy(buf.data(), &h, sizeof h);
  BOOST_REQUIRE(f.channel().send_raw(buf.data(), buf.size(), nullptr, 0).ok());
  BOOST_TEST(logged("payload of 4096 bytes exceeds the largest message"));
  auto r = f.channel().recv();
  BOOST_TEST(!r.ok());  // closed
  still_serving();
}

BOOST_AUTO_TEST_CASE(wrong_payload_size_and_bad_flags_are_refused) {
  auto f = fresh();
  Message m = make_request(Request::set_vring_num);
  m.hdr.size = 4;
  expect_nack(f, std::move(m));
  BOOST_TEST(logged("SET_VRING_NUM: payload is 4 bytes; 8 to 8 are allowed"));
  Message v = make_request(Request::get_queue_num);
  v.hdr.flags = 2;  // version 2
  BOOST_REQUIRE(f.channel().send(v).ok());
  BOOST_TEST(logged("has protocol version 2"));
  BOOST_TEST(logged("disconnected: could not answer GET_QUEUE_NUM"));  // a GET it cannot answer
  still_serving();
}

BOOST_AUTO_TEST_CASE(wrong_fd_counts_are_refused_and_every_fd_is_closed) {
  auto f = fresh();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int fds_before = child.open_fds();
  for (int i = 0; i < 50; ++i) {
    // SET_VRING_KICK with three fds (takes one).
    Message k = make_request(Request::set_vring_kick);
    k.set(std::uint64_t{0});
    for (int j = 0; j < 3; ++j) k.fds.emplace_back(::eventfd(0, EFD_CLOEXEC));
    expect_nack(f, std::move(k));
    // SET_MEM_TABLE naming two regions with one fd.
    Message t = make_request(Request::set_mem_table);
    t.set(MemTableHeader{2, 0});
    t.hdr.size = sizeof(MemTableHeader) + 2 * sizeof(MemRegion);
    t.fds.emplace_back(::eventfd(0, EFD_CLOEXEC));
    expect_nack(f, std::move(t));
  }
  BOOST_TEST(logged("SET_VRING_KICK: carries 3 file descriptors but its flags say 1"));
  BOOST_TEST(logged("SET_MEM_TABLE: lists 2 regions but carries 1 file descriptors"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the last message is freed after its nack
  BOOST_TEST(child.open_fds() == fds_before);
  still_serving(&f);
}

BOOST_AUTO_TEST_CASE(memory_region_larger_than_its_fd_is_refused) {
  auto f = fresh();
  UniqueFd mfd(::memfd_create("short", MFD_CLOEXEC));
  BOOST_REQUIRE(::ftruncate(mfd.get(), 1 << 20) == 0);
  Message t = make_request(Request::set_mem_table);
  t.set(MemTableHeader{1, 0});
  MemRegion r{0, 16 << 20, 0x7f0000000000, 0};  // claims 16 MiB of a 1 MiB memfd
  t.set_bytes(sizeof(MemTableHeader), &r, sizeof r);
  t.hdr.size = sizeof(MemTableHeader) + sizeof(MemRegion);
  t.fds.emplace_back(::dup(mfd.get()));
  expect_nack(f, std::move(t));
  BOOST_TEST(logged("needs 0x1000000 bytes of its fd but the fd has only 0x100000"));
  // Overlapping regions are refused too.
  Message a = make_request(Request::add_mem_reg);
  a.set(SingleMemRegion{0, {0, 1 << 20, 0x10000000, 0}});
  a.fds.emplace_back(::dup(mfd.get()));
  BOOST_REQUIRE(f.request(std::move(a)).ok());
  Message b = make_request(Request::add_mem_reg);
  b.set(SingleMemRegion{0, {0x80000, 1 << 19, 0x20000000, 0}});
  b.fds.emplace_back(::dup(mfd.get()));
  expect_nack(f, std::move(b));
  BOOST_TEST(logged("overlap"));
  still_serving(&f);
}

BOOST_AUTO_TEST_CASE(oversize_vring_and_out_of_range_index_are_refused) {
  auto f = fresh();
  Message n = make_request(Request::set_vring_num);
  n.set(VringState{0, 65536});
  expect_nack(f, std::move(n));
  Message i = make_request(Request::set_vring_num);
  i.set(VringState{7, 128});
  expect_nack(f, std::move(i));
  BOOST_TEST(logged("names vring 7, but the device has 2 queues"));
  Message c = make_request(Request::get_config);
  c.set(ConfigHeader{200, 100, 0});
  c.hdr.size = sizeof(ConfigHeader) + 100;
  BOOST_REQUIRE(f.channel().send(c).ok());
  BOOST_TEST(logged("config window offset 200 size 100 exceeds 256 bytes"));
  BOOST_TEST(logged("disconnected: could not answer GET_CONFIG"));
  still_serving();
}

BOOST_AUTO_TEST_CASE(stalled_partial_message_times_out) {
  auto f = fresh();
  const std::uint8_t half[6] = {1, 0, 0, 0, 1, 0};
  BOOST_REQUIRE(f.channel().send_raw(half, sizeof half, nullptr, 0).ok());
  BOOST_TEST(logged("a message must arrive whole within 2000 ms of its first byte"));
  still_serving();
}

namespace {

// A client with rings; returns it after one good request, so tampering starts from a live ring.
std::unique_ptr<BlkClient> live_client(const std::string& sock) {
  BlkClientOptions o;
  o.queues = 1;
  o.queue_size = 16;
  o.ram_mib = 16;
  o.event_idx = false;
  auto c = BlkClient::connect(sock, o);
  BOOST_REQUIRE(c);
  std::vector<BlkOp> ops{{0, kBlkIn, 0, {}, 512}};
  BOOST_REQUIRE((*c)->run(ops).ok());
  return std::move(*c);
}

// Publishes avail entry `head` by hand after the driver queue's own entries.
void publish_raw(BlkClient& c, std::uint16_t head) {
  auto& q = c.queue(0);
  auto* avail = c.ram().host(q.driver_gpa(), 4 + 2u * q.size());
  std::uint16_t idx;
  std::memcpy(&idx, avail + 2, 2);
  std::memcpy(avail + 4 + 2 * (idx % q.size()), &head, 2);
  ++idx;
  std::memcpy(avail + 2, &idx, 2);
}

std::uint16_t used_idx(BlkClient& c) {
  std::uint16_t u;
  std::memcpy(&u, c.ram().host(c.queue(0).device_gpa() + 2, 2), 2);
  return u;
}

struct RawDesc {
  std::uint64_t addr;
  std::uint32_t len;
  std::uint16_t flags, next;
};

}  // namespace

BOOST_AUTO_TEST_CASE(descriptor_loop_breaks_the_ring_and_writes_nothing) {
  auto c = live_client(sock);
  auto* d = reinterpret_cast<RawDesc*>(c->ram().host(c->queue(0).desc_gpa(), 16 * 16));
  d[10] = {0x200000, 16, 1, 11};
  d[11] = {0x201000, 512, 1, 10};  // 11 -> 10 -> 11 ...
  publish_raw(*c, 10);
  const auto u = used_idx(*c);
  BOOST_REQUIRE(c->frontend().kick(0).ok());
  BOOST_TEST(logged("descriptor chain from head 10 loops"));
  BOOST_TEST(used_idx(*c) == u);
  still_serving(&c->frontend());
}

BOOST_AUTO_TEST_CASE(descriptor_outside_guest_memory_is_an_error_not_a_write) {
  auto c = live_client(sock);
  auto* d = reinterpret_cast<RawDesc*>(c->ram().host(c->queue(0).desc_gpa(), 16 * 16));
  // Header in guest memory; the data buffer in the hole between 640 KiB and 1 MiB, then
  // far outside: the device must refuse the chain before writing anything.
  d[5] = {0x100000 + 0x1000, 16, 1, 6};
  d[6] = {0xb0000, 4096, 1 | 2, 7};
  d[7] = {0x100000 + 0x2000, 1, 2, 0};
  publish_raw(*c, 5);
  BOOST_REQUIRE(c->frontend().kick(0).ok());
  BOOST_TEST(logged("descriptor buffer 0xb0000+0x1000 is outside guest memory"));
  still_serving(&c->frontend());
}

BOOST_AUTO_TEST_CASE(avail_index_jump_and_bad_head_are_errors) {
  auto c = live_client(sock);
  publish_raw(*c, 200);  // head beyond a 16-entry queue
  BOOST_REQUIRE(c->frontend().kick(0).ok());
  BOOST_TEST(logged("descriptor head 200 is outside a queue of 16"));
  still_serving(&c->frontend());
}

BOOST_AUTO_TEST_CASE(ring_at_a_wild_address_stays_stopped) {
  auto f = fresh();
  auto ram = GuestRam::create(GuestRam::vm_layout(8));
  BOOST_REQUIRE(ram);
  BOOST_REQUIRE(f.set_mem_table(*ram).ok());
  Message n = make_request(Request::set_vring_num);
  n.set(VringState{0, 64});
  BOOST_REQUIRE(f.request(std::move(n)).ok());
  Message a = make_request(Request::set_vring_addr);
  a.set(VringAddr{0, 0, 0xdead0000000, 0xdead0010000, 0xdead0020000, 0});
  BOOST_REQUIRE(f.request(std::move(a)).ok());
  UniqueFd kick(::eventfd(0, EFD_CLOEXEC));
  Message k = make_request(Request::set_vring_kick);
  k.set(std::uint64_t{0});
  k.fds.emplace_back(::dup(kick.get()));
  BOOST_REQUIRE(f.request(std::move(k)).ok());
  BOOST_TEST(logged("ring addresses are not inside guest memory"));
  auto base = f.get_vring_base(0);
  BOOST_REQUIRE(base);
  BOOST_TEST(*base == 0u);
  still_serving(&f);
}

BOOST_AUTO_TEST_SUITE_END()

// The inflight area comes back from the frontend on reconnect: a restarted backend must treat it
// as untrusted. A packed slice that lies (a head in flight with more descriptors than the ring
// has) keeps that ring stopped with a sentence; the backend stays up for the next frontend.
BOOST_AUTO_TEST_CASE(an_inconsistent_packed_inflight_area_keeps_the_ring_stopped_and_the_backend_serving) {
  TempDir dir;
  const std::string sock = dir.file("blk.sock"), log = dir.file("backend.log"), disk = dir.file("disk.img");
  auto start = [&] {
    ::unlink(sock.c_str());
    auto c = std::make_unique<Child>(std::vector<std::string>{VHOST_BLK_BACKEND, "--socket", sock, "--disk", disk,
                                                              "--size-mib", "8", "--queues", "1"},
                                     log);
    BOOST_REQUIRE(wait_for_path(sock, 5000));
    return c;
  };
  auto logged = [&](const std::string& s) {
    for (int i = 0; i < 400; ++i) {
      if (read_file(log).find(s) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    BOOST_TEST_MESSAGE("log was:\n" << read_file(log));
    return false;
  };
  auto backend = start();
  BlkClientOptions o;
  o.queues = 1;
  o.packed = true;
  o.queue_size = 32;
  o.ram_mib = 16;
  auto c = BlkClient::connect(sock, o);
  BOOST_REQUIRE(c);
  std::vector<BlkOp> ops;
  for (int i = 0; i < 8; ++i) ops.push_back({0, kBlkOut, std::uint64_t(i) * 8, pattern(50 + i, 4096)});
  BOOST_REQUIRE((*c)->run(ops).ok());
  backend->stop(SIGKILL);
  // Entry 3 of queue 0's slice (32-byte header, 32-byte entries): in flight, 40 descriptors.
  const auto& inf = (*c)->inflight_area();
  void* p = ::mmap(nullptr, inf.info.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, inf.fd.get(),
                   static_cast<off_t>(inf.info.mmap_offset));
  BOOST_REQUIRE(p != MAP_FAILED);
  auto* entry3 = static_cast<std::uint8_t*>(p) + 32 + 32 * 3;
  entry3[0] = 1;
  const std::uint16_t num = 40;
  std::memcpy(entry3 + 6, &num, 2);
  ::munmap(p, inf.info.mmap_size);
  backend = start();
  BOOST_REQUIRE((*c)->reconnect(sock).ok());
  BOOST_TEST(logged("inflight area of a packed queue of 32 is inconsistent: entry 3 is in flight with 40 descriptors"));
  BOOST_TEST(logged("the ring stays stopped"));
  BOOST_REQUIRE(backend->alive());
  // The next frontend (with an area of its own) is served, and the data written before is there.
  (*c).reset();
  auto d = BlkClient::connect(sock, o);
  BOOST_REQUIRE(d);
  std::vector<BlkOp> reads;
  for (int i = 0; i < 8; ++i) reads.push_back({0, kBlkIn, std::uint64_t(i) * 8, {}, 4096});
  BOOST_REQUIRE((*d)->run(reads).ok());
  for (int i = 0; i < 8; ++i)
    BOOST_TEST(checksum(reads[i].data.data(), 4096) == checksum(pattern(50 + i, 4096).data(), 4096));
}
