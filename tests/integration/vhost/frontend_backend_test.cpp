// Our frontend against our backend: a vhost_blk_backend process over a real UNIX socket,
// memfd guest RAM with a VM-like layout, real eventfds.
#define BOOST_TEST_MODULE vhost_frontend_backend
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "blk_client.hpp"
#include "process.hpp"

using namespace vrdma;
using namespace vrdma::test;

namespace {

constexpr std::uint64_t kDiskMiB = 32;

struct Backend {
  TempDir dir;
  std::string sock = dir.file("blk.sock");
  std::string disk = dir.file("disk.img");
  std::string log = dir.file("backend.log");
  std::unique_ptr<Child> child;

  explicit Backend(std::vector<std::string> extra = {}) { start(std::move(extra)); }
  void start(std::vector<std::string> extra = {}) {
    ::unlink(sock.c_str());
    std::vector<std::string> argv{VHOST_BLK_BACKEND, "--socket", sock, "--disk", disk, "--size-mib",
                                  std::to_string(kDiskMiB), "--queues", "4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    child = std::make_unique<Child>(argv, log);
    BOOST_REQUIRE_MESSAGE(wait_for_path(sock, 5000), "backend did not create its socket; log:\n" + read_file(log));
  }
  ~Backend() {
    if (child) child->stop(SIGTERM);
  }
};

// Writes random-sized checksummed blocks across all queues, reads them back, and checks
// both what the guest read and what landed in the backend's disk file.
void roundtrip(BlkClientOptions o, std::vector<std::string> backend_args = {}) {
  Backend b(std::move(backend_args));
  auto c = BlkClient::connect(b.sock, o);
  BOOST_REQUIRE_MESSAGE(c, (c ? "" : c.error().message) + "\n" + read_file(b.log));
  std::mt19937_64 rng(42 + o.queue_size + (o.packed ? 1 : 0) + (o.indirect ? 2 : 0));
  std::vector<BlkOp> writes;
  std::uint64_t sector = 0;
  for (int i = 0; i < 400; ++i) {
    BlkOp op;
    op.queue = static_cast<std::uint16_t>(i % o.queues);
    op.type = kBlkOut;
    op.sector = sector;
    const std::size_t len = 512 * (1 + rng() % 64);  // 512 B .. 32 KiB
    op.data = pattern(static_cast<std::uint64_t>(i), len);
    sector += len / 512;
    writes.push_back(std::move(op));
  }
  BOOST_REQUIRE(sector * 512 <= kDiskMiB << 20);
  auto st = (*c)->run(writes);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
  std::vector<BlkOp> reads;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    BlkOp r;
    r.queue = static_cast<std::uint16_t>((i + 1) % o.queues);  // read on a different queue
    r.type = kBlkIn;
    r.sector = writes[i].sector;
    r.len = static_cast<std::uint32_t>(writes[i].data.size());
    reads.push_back(std::move(r));
  }
  st = (*c)->run(reads);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
  const std::string disk = read_file(b.disk);
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const auto want = checksum(writes[i].data.data(), writes[i].data.size());
    BOOST_REQUIRE_EQUAL(checksum(reads[i].data.data(), reads[i].data.size()), want);
    BOOST_REQUIRE_EQUAL(checksum(reinterpret_cast<const std::uint8_t*>(disk.data()) + writes[i].sector * 512,
                                 writes[i].data.size()),
                        want);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(checksummed_io_on_four_split_queues_with_event_idx) { roundtrip({}); }

BOOST_AUTO_TEST_CASE(checksummed_io_on_split_queues_without_event_idx) {
  BlkClientOptions o;
  o.event_idx = false;
  roundtrip(o);
}

BOOST_AUTO_TEST_CASE(checksummed_io_with_indirect_descriptors) {
  BlkClientOptions o;
  o.indirect = true;
  roundtrip(o);
}

BOOST_AUTO_TEST_CASE(checksummed_io_on_packed_queues) {
  BlkClientOptions o;
  o.packed = true;
  o.queue_size = 100;  // packed rings need not be a power of two
  roundtrip(o);
}

BOOST_AUTO_TEST_CASE(checksummed_io_on_packed_queues_with_indirect_without_event_idx) {
  BlkClientOptions o;
  o.packed = true;
  o.indirect = true;
  o.event_idx = false;
  roundtrip(o);
}

BOOST_AUTO_TEST_CASE(checksummed_io_with_memory_added_region_by_region) {
  BlkClientOptions o;
  o.add_mem_reg = true;
  o.queue_size = 64;
  roundtrip(o);
}

BOOST_AUTO_TEST_CASE(config_space_reports_capacity_and_queues) {
  Backend b;
  auto c = BlkClient::connect(b.sock, {});
  BOOST_REQUIRE(c);
  auto cfg = (*c)->frontend().get_config(0, 36);
  BOOST_REQUIRE(cfg);
  std::uint64_t cap;
  std::uint16_t nq;
  std::memcpy(&cap, cfg->data(), 8);
  std::memcpy(&nq, cfg->data() + 34, 2);
  BOOST_TEST(cap == (kDiskMiB << 20) / 512);
  BOOST_TEST(nq == 4);
}

BOOST_AUTO_TEST_CASE(get_vring_base_stops_every_write_to_guest_memory) {
  Backend b;
  BlkClientOptions o;
  auto c = BlkClient::connect(b.sock, o);
  BOOST_REQUIRE(c);
  std::vector<BlkOp> ops;
  for (int i = 0; i < 40; ++i) ops.push_back({static_cast<std::uint16_t>(i % 4), kBlkIn, std::uint64_t(i) * 8, {}, 4096});
  BOOST_REQUIRE((*c)->run(ops).ok());
  for (std::uint16_t q = 0; q < 4; ++q) {
    auto base = (*c)->frontend().get_vring_base(q);
    BOOST_REQUIRE(base);
    BOOST_TEST(*base == 10u);  // every request the device took, and no more
  }
  // Post more requests and kick: a stopped backend must not touch guest memory at all.
  std::vector<BlkOp> more;
  for (int i = 0; i < 16; ++i) more.push_back({static_cast<std::uint16_t>(i % 4), kBlkIn, 0, {}, 4096});
  BOOST_REQUIRE((*c)->post(more).ok());
  auto& ram = (*c)->ram();
  std::vector<std::uint8_t> before(ram.fd_size());
  BOOST_REQUIRE(::pread(ram.fd(), before.data(), before.size(), 0) == static_cast<ssize_t>(before.size()));
  for (std::uint16_t q = 0; q < 4; ++q) BOOST_REQUIRE((*c)->frontend().kick(q).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<std::uint8_t> after(ram.fd_size());
  BOOST_REQUIRE(::pread(ram.fd(), after.data(), after.size(), 0) == static_cast<ssize_t>(after.size()));
  BOOST_TEST((before == after), "the backend wrote guest memory after GET_VRING_BASE");
  // And the backend is still healthy: restarting the rings at their base serves the requests.
  for (std::uint16_t q = 0; q < 4; ++q) BOOST_REQUIRE((*c)->frontend().start_queue(q, (*c)->queue(q), 10u).ok());
  for (std::uint16_t q = 0; q < 4; ++q) BOOST_REQUIRE((*c)->frontend().kick(q).ok());
  BOOST_REQUIRE((*c)->collect(more, 5000).ok());
  for (const auto& op : more) BOOST_TEST(op.status == kBlkOk);
}

// The switchover's batches: every ring stopped with one batch of GET_VRING_BASE (answers in the
// order asked, whatever that order) and started again with one batch of NUM/BASE/ADDR/CALL/KICK/
// ENABLE for all four, each at its own base.
BOOST_AUTO_TEST_CASE(rings_stop_and_start_in_one_batch_each_at_their_own_bases) {
  Backend b;
  BlkClientOptions o;
  auto c = BlkClient::connect(b.sock, o);
  BOOST_REQUIRE(c);
  std::vector<BlkOp> ops;
  for (std::uint16_t q = 0; q < 4; ++q)
    for (int i = 0; i < 4 * (q + 1); ++i) ops.push_back({q, kBlkIn, std::uint64_t(i) * 8, {}, 4096});
  BOOST_REQUIRE((*c)->run(ops).ok());
  const std::vector<std::uint16_t> order{3, 0, 2, 1};
  auto bases = (*c)->frontend().get_vring_bases(order);
  BOOST_REQUIRE_MESSAGE(bases.ok(), (bases.ok() ? std::string() : bases.error().message));
  BOOST_TEST(*bases == (std::vector<std::uint32_t>{16, 4, 12, 8}), boost::test_tools::per_element());
  std::vector<BlkOp> more;
  for (int i = 0; i < 16; ++i) more.push_back({static_cast<std::uint16_t>(i % 4), kBlkIn, 0, {}, 4096});
  BOOST_REQUIRE((*c)->post(more).ok());
  std::vector<vhost::Frontend::QueueStart> starts;
  for (std::size_t i = 0; i < order.size(); ++i) starts.push_back({order[i], &(*c)->queue(order[i]), (*bases)[i]});
  auto st = (*c)->frontend().start_queues(starts);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
  for (std::uint16_t q = 0; q < 4; ++q) BOOST_REQUIRE((*c)->frontend().kick(q).ok());
  BOOST_REQUIRE((*c)->collect(more, 5000).ok());
  for (const auto& op : more) BOOST_TEST(op.status == kBlkOk);
  // A batch with a request the backend refuses fails as a whole, with the refusal named.
  std::vector<vhost::Message> bad;
  bad.push_back(vhost::make_request(vhost::Request::get_queue_num));
  vhost::Message num = vhost::make_request(vhost::Request::set_vring_num);
  num.set(vhost::VringState{0, 3});  // not a power of two
  bad.push_back(std::move(num));
  auto r = (*c)->frontend().requests(std::move(bad));
  BOOST_REQUIRE(!r);
  BOOST_TEST_MESSAGE("refused batch: " << r.error().message);
  BOOST_TEST(r.error().message.find("SET_VRING_NUM") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dirty_log_covers_every_byte_the_backend_wrote) {
  Backend b;
  BlkClientOptions o;
  o.queues = 2;
  auto c = BlkClient::connect(b.sock, o);
  BOOST_REQUIRE(c);
  auto& ram = (*c)->ram();
  // One bit per 4 KiB page up to the top of guest memory.
  std::uint64_t top = 0;
  for (const auto& r : ram.layout()) top = std::max(top, r.gpa + r.size);
  const std::uint64_t log_bytes = (top / 4096 + 7) / 8;
  UniqueFd logfd(::memfd_create("dirty-log", MFD_CLOEXEC));
  BOOST_REQUIRE(::ftruncate(logfd.get(), static_cast<off_t>(log_bytes)) == 0);
  auto* bits = static_cast<std::uint8_t*>(::mmap(nullptr, log_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, logfd.get(), 0));
  BOOST_REQUIRE(bits != MAP_FAILED);
  auto& fe = (*c)->frontend();
  BOOST_REQUIRE(fe.set_log_base(logfd.get(), log_bytes).ok());
  // Without LOG_ALL nothing is logged.
  std::vector<BlkOp> warm;
  for (int i = 0; i < 8; ++i) warm.push_back({static_cast<std::uint16_t>(i % 2), kBlkIn, 0, {}, 8192});
  BOOST_REQUIRE((*c)->run(warm).ok());
  BOOST_TEST(std::all_of(bits, bits + log_bytes, [](std::uint8_t x) { return x == 0; }));
  auto f = fe.features();
  BOOST_REQUIRE(fe.set_features(f.set(vhost::VirtioFeature::log_all)).ok());

  // Post, snapshot guest RAM, let the backend work, snapshot again: every byte that changed
  // was written by the backend, and its page must be marked.
  std::vector<BlkOp> ops;
  for (int i = 0; i < 64; ++i)
    ops.push_back({static_cast<std::uint16_t>(i % 2), kBlkIn, std::uint64_t(i) * 16, {}, 512u * (1 + i % 40)});
  // Make the disk content non-zero so reads change guest memory.
  std::vector<BlkOp> fill;
  for (int i = 0; i < 64; ++i) fill.push_back({0, kBlkOut, std::uint64_t(i) * 16, pattern(7 + i, 512u * (1 + i % 40))});
  BOOST_REQUIRE((*c)->run(fill).ok());
  std::memset(bits, 0, log_bytes);
  BOOST_REQUIRE((*c)->post(ops, /*kick=*/false).ok());
  std::vector<std::uint8_t> before(ram.fd_size()), after(ram.fd_size());
  BOOST_REQUIRE(::pread(ram.fd(), before.data(), before.size(), 0) == static_cast<ssize_t>(before.size()));
  for (std::uint16_t q = 0; q < 2; ++q) BOOST_REQUIRE(fe.kick(q).ok());
  // Wait until the used indexes show every request done, touching nothing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::uint16_t u0, u1;
    std::memcpy(&u0, ram.host((*c)->queue(0).device_gpa() + 2, 2), 2);
    std::memcpy(&u1, ram.host((*c)->queue(1).device_gpa() + 2, 2), 2);
    if (static_cast<std::uint16_t>(u0 + u1) == static_cast<std::uint16_t>(8 + 64 + 64)) break;  // warm, fill, ops
    BOOST_REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  BOOST_REQUIRE(::pread(ram.fd(), after.data(), after.size(), 0) == static_cast<ssize_t>(after.size()));
  std::size_t changed = 0, unlogged = 0;
  for (const auto& r : ram.layout()) {
    for (std::uint64_t off = 0; off < r.size; ++off) {
      if (before[r.fd_offset + off] == after[r.fd_offset + off]) continue;
      ++changed;
      const std::uint64_t page = (r.gpa + off) / 4096;
      if ((bits[page / 8] & (1u << (page % 8))) == 0) ++unlogged;
    }
  }
  BOOST_TEST(changed > 64u * 512u);  // the reads really changed guest memory
  BOOST_TEST(unlogged == 0u);
  // And the log is not simply all ones.
  std::size_t marked = 0;
  for (std::uint64_t i = 0; i < log_bytes; ++i) marked += static_cast<std::size_t>(__builtin_popcount(bits[i]));
  BOOST_TEST(marked < 200u);
  BOOST_REQUIRE((*c)->collect(ops, 5000).ok());
  ::munmap(bits, log_bytes);
}

namespace {

// The first backend dies (as a crash would) with request 100 popped but not completed; a new
// backend process gets the inflight area back and must complete every outstanding request
// exactly once: the driver fails on a used id it does not own, and the second backend's request
// counter must be exactly what was outstanding.
void resume_after_crash(BlkClientOptions o) {
  Backend b({"--crash-after", "100"});
  o.queues = 1;
  auto c = BlkClient::connect(b.sock, o);
  BOOST_REQUIRE(c);
  std::vector<BlkOp> ops;
  for (int i = 0; i < 120; ++i) ops.push_back({0, kBlkOut, std::uint64_t(i) * 8, pattern(1000 + i, 4096)});
  BOOST_REQUIRE(!(*c)->run(ops, 2000).ok());  // the backend died mid-way
  BOOST_REQUIRE(b.child->wait(3000) != -1);
  std::size_t outstanding = 0;
  for (const auto& op : ops) outstanding += op.status == 0xff ? 1 : 0;
  BOOST_TEST(outstanding == 20u);
  b.start();  // same disk and socket; a new process without the crash hook
  auto st = (*c)->reconnect(b.sock);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
  st = (*c)->collect(ops, 5000);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
  for (const auto& op : ops) BOOST_TEST(op.status == kBlkOk);
  BOOST_TEST(!(*c)->queue(0).broken());
  BOOST_TEST(read_file(b.log).find("resuming 1 in-flight requests") != std::string::npos);
  std::vector<BlkOp> reads;
  for (int i = 0; i < 120; ++i) reads.push_back({0, kBlkIn, std::uint64_t(i) * 8, {}, 4096});
  BOOST_REQUIRE((*c)->run(reads).ok());
  for (int i = 0; i < 120; ++i)
    BOOST_REQUIRE_EQUAL(checksum(reads[i].data.data(), 4096), checksum(pattern(1000 + i, 4096).data(), 4096));
  // Exactly once: the second backend served the 20 outstanding writes and the 120 reads.
  b.child->stop(SIGTERM);
  b.child.reset();
  BOOST_TEST(read_file(b.log).find("requests=140 ") != std::string::npos, "second backend's counters:\n" + read_file(b.log));
}

}  // namespace

BOOST_AUTO_TEST_CASE(restarted_backend_resumes_rings_with_a_request_in_flight) { resume_after_crash({}); }

BOOST_AUTO_TEST_CASE(restarted_backend_resumes_packed_rings_with_a_request_in_flight) {
  BlkClientOptions o;
  o.packed = true;
  o.queue_size = 100;
  resume_after_crash(o);
}

BOOST_AUTO_TEST_CASE(restarted_backend_resumes_packed_rings_with_indirect_descriptors) {
  BlkClientOptions o;
  o.packed = true;
  o.indirect = true;
  o.queue_size = 64;
  resume_after_crash(o);
}

BOOST_AUTO_TEST_CASE(device_state_travels_through_a_pipe_both_ways) {
  Backend b;
  auto f = vhost::Frontend::connect(b.sock);
  BOOST_REQUIRE(f);
  auto acked = f->negotiate({vhost::VirtioFeature::version_1, vhost::VirtioFeature::protocol_features},
                            {vhost::ProtocolFeature::reply_ack, vhost::ProtocolFeature::device_state});
  BOOST_REQUIRE(acked);
  BOOST_REQUIRE(f->protocol_features().has(vhost::ProtocolFeature::device_state));
  auto transfer = [&](std::uint32_t direction, const std::string& payload) {
    int p[2];
    BOOST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    UniqueFd rd(p[0]), wr(p[1]);
    vhost::Message m = vhost::make_request(vhost::Request::set_device_state_fd);
    m.set(vhost::DeviceStateXfer{direction, 0});
    m.fds.emplace_back(::dup(direction == 0 ? wr.get() : rd.get()));
    auto r = f->request(std::move(m));
    BOOST_REQUIRE(r && r->has_value());
    BOOST_TEST((*r)->get<std::uint64_t>() == 0x100u);  // success, backend uses our fd
    std::string got;
    if (direction == 0) {
      wr.reset();
      char buf[256];
      ssize_t n;
      while ((n = ::read(rd.get(), buf, sizeof buf)) > 0) got.append(buf, static_cast<std::size_t>(n));
    } else {
      rd.reset();
      BOOST_REQUIRE(::write(wr.get(), payload.data(), payload.size()) == static_cast<ssize_t>(payload.size()));
      wr.reset();
    }
    std::uint64_t check = 1;
    for (int i = 0; i < 100 && check != 0; ++i) {
      auto c = f->request(vhost::make_request(vhost::Request::check_device_state));
      BOOST_REQUIRE(c && c->has_value());
      check = (*c)->get<std::uint64_t>();
      if (check != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    BOOST_TEST(check == 0u);
    return got;
  };
  BOOST_TEST(transfer(0, "").empty());  // the blk fixture is stateless: an empty blob, then EOF
  transfer(1, "opaque device state");
}

// QEMU 7.2's vhost-user-blk, reconnecting to a restarted backend while a guest migrates in,
// sends SET_FEATURES with VHOST_USER_F_PROTOCOL_FEATURES acked but no SET_PROTOCOL_FEATURES on
// the new connection. The backend takes the protocol features it offers as negotiated (and says
// so), so that gated requests work; a frontend that acks no protocol features gets none.
BOOST_AUTO_TEST_CASE(a_frontend_acking_protocol_features_without_negotiating_them_gets_the_offered_ones) {
  using vhost::ProtocolFeature;
  using vhost::VirtioFeature;
  Backend b;
  {
    auto first = vhost::Frontend::connect(b.sock);
    BOOST_REQUIRE(first);
    BOOST_REQUIRE(first->negotiate({VirtioFeature::version_1, VirtioFeature::protocol_features},
                                   {ProtocolFeature::mq, ProtocolFeature::reply_ack}));
    BOOST_REQUIRE(first->get_queue_num());
  }
  {
    auto again = vhost::Frontend::connect(b.sock);
    BOOST_REQUIRE(again);
    BOOST_REQUIRE(again->set_features({VirtioFeature::version_1, VirtioFeature::protocol_features}).ok());
    auto n = again->get_queue_num();  // gated on the MQ protocol feature
    BOOST_REQUIRE_MESSAGE(n, (n ? "" : n.error().message) + "\n" + read_file(b.log));
    BOOST_TEST(*n == 4u);
    BOOST_TEST(read_file(b.log).find("it carries on from an earlier one") != std::string::npos);
  }
  // One frontend at a time: the next connects once the backend saw this one go.
  for (int i = 0; i < 500 && count_in(read_file(b.log), "frontend disconnected") < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto plain = vhost::Frontend::connect(b.sock);
  BOOST_REQUIRE(plain);
  BOOST_REQUIRE(plain->set_features({VirtioFeature::version_1}).ok());
  BOOST_TEST(!plain->get_queue_num().ok());
  for (int i = 0; i < 200 && read_file(b.log).find("needs protocol feature bit") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BOOST_TEST(read_file(b.log).find("needs protocol feature bit") != std::string::npos, read_file(b.log));
  BOOST_TEST(b.child->alive());
}
