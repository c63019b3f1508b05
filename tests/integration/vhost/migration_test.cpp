// Live migration without QEMU: our frontend moves a vhost-user-blk device between two
// vhost_blk_backend processes (sharing one disk file, as two hosts share storage) with
// LiveMigration (support/live_migration.hpp), while the driver does checksummed I/O the whole time.
// After switchover the destination RAM must equal the stopped source's byte for byte (pages are
// copied only where a dirty log marks them, so a backend write missing from its log shows up
// here), and every block read on either side must carry the data last written to it.
#define BOOST_TEST_MODULE vhost_frontend_migration
#include <boost/test/unit_test.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "blk_client.hpp"
#include "process.hpp"
#include "live_migration.hpp"

using namespace vrdma;
using namespace vrdma::test;

namespace {

constexpr std::uint64_t kDiskMiB = 16;
constexpr std::uint64_t kBlock = 4096;
constexpr std::uint64_t kBlocks = (kDiskMiB << 20) / kBlock;

struct BackendProc {
  std::string sock, log;
  std::unique_ptr<Child> child;
  BackendProc(const TempDir& dir, const std::string& name, const std::string& disk, std::vector<std::string> extra) {
    sock = dir.file(name + ".sock");
    log = dir.file(name + ".log");
    std::vector<std::string> argv{VHOST_BLK_BACKEND, "--socket", sock, "--disk", disk, "--size-mib",
                                  std::to_string(kDiskMiB), "--queues", "4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    child = std::make_unique<Child>(argv, log);
    BOOST_REQUIRE_MESSAGE(wait_for_path(sock, 5000), "backend did not create its socket; log:\n" + read_file(log));
  }
  ~BackendProc() {
    if (child) child->stop(SIGTERM);
  }
};

// The guest's view of its disk: the seed of the data last written to each 4 KiB block.
class Workload {
 public:
  explicit Workload(std::uint16_t queues) : queues_(queues), seeds_(kBlocks, 0) {}

  // Writes every block once (seed = block + 1), so reads always have something to check.
  std::vector<BlkOp> fill() {
    std::vector<BlkOp> ops;
    for (std::uint64_t b = 0; b < kBlocks; b += 8) ops.push_back(write_op(static_cast<std::uint16_t>(ops.size() % queues_), b, 8));
    return ops;
  }
  // A batch of `n` requests on disjoint block ranges (they complete in any order), half
  // writes of fresh data and half reads of data written earlier, spread over the queues.
  std::vector<BlkOp> batch(std::size_t n) {
    std::vector<BlkOp> ops;
    std::vector<bool> used(kBlocks, false);
    while (ops.size() < n) {
      const std::uint64_t len = 1 + rng_() % 8;
      const std::uint64_t b = rng_() % (kBlocks - len);
      if (std::any_of(used.begin() + static_cast<long>(b), used.begin() + static_cast<long>(b + len), [](bool u) { return u; }))
        continue;
      std::fill(used.begin() + static_cast<long>(b), used.begin() + static_cast<long>(b + len), true);
      const auto q = static_cast<std::uint16_t>(ops.size() % queues_);
      if (rng_() % 2 == 0) {
        ops.push_back(write_op(q, b, len));
      } else {
        BlkOp r;
        r.queue = q;
        r.type = kBlkIn;
        r.sector = b * (kBlock / 512);
        r.len = static_cast<std::uint32_t>(len * kBlock);
        ops.push_back(std::move(r));
      }
    }
    return ops;
  }
  // Checks completed ops: reads against the seeds, writes become the new seeds.
  void verify(const std::vector<BlkOp>& ops, const char* where) {
    for (const auto& op : ops) {
      BOOST_REQUIRE_MESSAGE(op.status == kBlkOk, where << ": request failed with status " << int{op.status});
      const std::uint64_t first = op.sector / (kBlock / 512);
      if (op.type == kBlkOut) {
        const auto it = pending_.find(op.sector);
        BOOST_REQUIRE(it != pending_.end());
        for (std::uint64_t i = 0; i < op.data.size() / kBlock; ++i) seeds_[first + i] = it->second + i;
        pending_.erase(it);
        continue;
      }
      BOOST_REQUIRE_EQUAL(op.data.size(), op.len);
      for (std::uint64_t i = 0; i < op.len / kBlock; ++i) {
        const auto want = pattern(seeds_[first + i], kBlock);
        if (std::memcmp(op.data.data() + i * kBlock, want.data(), kBlock) != 0) {
          ++bad_reads_;
          BOOST_ERROR(where << ": block " << first + i << " read back wrong data (checksum "
                            << checksum(op.data.data() + i * kBlock, kBlock) << ", want " << checksum(want.data(), kBlock)
                            << ")");
        }
      }
      ++reads_checked_;
    }
  }
  // Reads every block of the disk and checks it.
  std::vector<BlkOp> read_all() {
    std::vector<BlkOp> ops;
    for (std::uint64_t b = 0; b < kBlocks; b += 16) {
      BlkOp r;
      r.queue = static_cast<std::uint16_t>(ops.size() % queues_);
      r.type = kBlkIn;
      r.sector = b * (kBlock / 512);
      r.len = static_cast<std::uint32_t>(16 * kBlock);
      ops.push_back(std::move(r));
    }
    return ops;
  }
  [[nodiscard]] std::uint64_t reads_checked() const { return reads_checked_; }
  [[nodiscard]] std::uint64_t bad_reads() const { return bad_reads_; }
  [[nodiscard]] std::uint64_t seed(std::uint64_t block) const { return seeds_[block]; }

 private:
  BlkOp write_op(std::uint16_t q, std::uint64_t b, std::uint64_t len) {
    BlkOp w;
    w.queue = q;
    w.type = kBlkOut;
    w.sector = b * (kBlock / 512);
    const std::uint64_t seed0 = next_seed_;
    next_seed_ += len;
    for (std::uint64_t i = 0; i < len; ++i) {
      const auto p = pattern(seed0 + i, kBlock);
      w.data.insert(w.data.end(), p.begin(), p.end());
    }
    pending_[w.sector] = seed0;  // ranges in flight are disjoint: the sector names the write
    return w;
  }

  std::uint16_t queues_;
  std::vector<std::uint64_t> seeds_;
  std::map<std::uint64_t, std::uint64_t> pending_;  // sector of a write in flight -> its first seed
  std::uint64_t next_seed_ = 1;
  std::mt19937_64 rng_{20261203};
  std::uint64_t reads_checked_ = 0, bad_reads_ = 0;
};

// Bytes of guest RAM that differ between the stopped source and the destination copy.
std::uint64_t ram_differences(vhost::GuestRam& src, vhost::GuestRam& dst, std::uint64_t& pages) {
  std::uint64_t bytes = 0;
  pages = 0;
  for (const auto& r : src.layout()) {
    for (std::uint64_t off = 0; off < r.size; off += kBlock) {
      const std::uint8_t* a = src.host(r.gpa + off, kBlock);
      const std::uint8_t* b = dst.host(r.gpa + off, kBlock);
      if (std::memcmp(a, b, kBlock) == 0) continue;
      ++pages;
      for (std::uint64_t i = 0; i < kBlock; ++i) bytes += a[i] != b[i] ? 1 : 0;
    }
  }
  return bytes;
}

// Waits, reading guest memory only, until the backend has written the status byte of every op
// on a queue in `qs` (it pushes the used entry right after, in the same queue callback, so
// GET_VRING_BASE, handled between callbacks, finds them completed).
void wait_completed(BlkClient& c, const std::vector<BlkOp>& ops, const std::vector<std::uint16_t>& qs) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (const auto& op : ops) {
    if (std::find(qs.begin(), qs.end(), op.queue) == qs.end()) continue;
    while (std::atomic_ref<std::uint8_t>(*c.ram().host(op.status_gpa, 1)).load(std::memory_order_acquire) == 0xff) {
      BOOST_REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "queue " << op.queue << " did not complete its requests");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

struct Outcome {
  std::uint64_t diff_bytes = 0, diff_pages = 0;
  std::uint64_t bad_reads = 0;
};

// A client of the backend at `a`, with every block of the disk written once, and the start of a
// migration of its device to `dst`. Exits 77 (skip) when the kernel cannot track the driver's
// writes to its RAM (Linux < 6.7).
struct Started {
  std::unique_ptr<BlkClient> client;
  Workload work;
  std::unique_ptr<vhost::GuestRam> dst;  // on the heap: the migration keeps its address
  std::unique_ptr<vhost::LiveMigration> mig;
};
Started start_migration(const BackendProc& a, const BlkClientOptions& o) {
  Started s{nullptr, Workload(o.queues), nullptr, nullptr};
  auto c = BlkClient::connect(a.sock, o);
  BOOST_REQUIRE_MESSAGE(c, (c ? "" : c.error().message) + "\n" + read_file(a.log));
  s.client = std::move(*c);
  auto fill = s.work.fill();
  BOOST_REQUIRE(s.client->run(fill).ok());
  s.work.verify(fill, "fill");
  auto dst = vhost::GuestRam::create_like(s.client->ram());
  BOOST_REQUIRE(dst);
  s.dst = std::make_unique<vhost::GuestRam>(std::move(*dst));
  auto mig = vhost::LiveMigration::begin(s.client->frontend(), s.client->ram(), *s.dst);
  if (!mig && mig.error().is(Errc::not_supported)) {
    BOOST_TEST_MESSAGE("skipped: " << mig.error().message);
    std::exit(77);
  }
  BOOST_REQUIRE_MESSAGE(mig, (mig ? "" : mig.error().message) + "\n" + read_file(a.log));
  s.mig = std::move(*mig);
  return s;
}

// The whole scenario; `source_args` lets a test give the source backend a fault on purpose.
Outcome migrate(BlkClientOptions o, std::vector<std::string> source_args, bool expect_clean) {
  TempDir dir;
  const std::string disk = dir.file("disk.img");
  BackendProc a(dir, "a", disk, std::move(source_args));
  BackendProc b(dir, "b", disk, {});
  Started mg = start_migration(a, o);
  BlkClient& cl = *mg.client;
  Workload& w = mg.work;
  vhost::GuestRam& dst = *mg.dst;
  vhost::LiveMigration& m = *mg.mig;

  // Pre-copy: each round runs while a batch of requests is in the backend's hands; the driver
  // then collects and checks it and posts the next. At least 3 rounds, until a round copies
  // few pages (each batch dirties its buffers, the rings and the request headers).
  const std::size_t per_batch = 12u * o.queues;
  for (int round = 0; round < 12; ++round) {
    auto ops = w.batch(per_batch);
    BOOST_REQUIRE(cl.post(ops).ok());
    auto r = m.precopy();
    BOOST_REQUIRE_MESSAGE(r, (r ? "" : r.error().message));
    auto st = cl.collect(ops, 10000);
    BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(a.log));
    w.verify(ops, "source during pre-copy");
    BOOST_TEST_MESSAGE("round " << round + 1 << ": copied " << r->copied << " pages (backend log " << r->log_pages
                                << ", driver " << r->driver_pages << ")");
    BOOST_TEST(r->outside == 0u);
    if (round >= 2 && r->copied < 2048) break;
  }
  BOOST_TEST(m.rounds().front().copied * 4096 >= (o.ram_mib - 1) << 20);  // round 1 copied all RAM
  BOOST_TEST(m.rounds().back().log_pages > 0u);                           // the backend logged its writes

  // Switchover with requests in every state: queues 0 and 1 are kicked and complete on the
  // source (their data lands in source RAM, logged; the driver reaps them only on the
  // destination); queues 2 and 3 are posted without a kick, so the destination serves them.
  auto last = w.batch(per_batch);
  BOOST_REQUIRE(cl.post(last, /*kick=*/false).ok());
  BOOST_REQUIRE(cl.frontend().kick(0).ok());
  BOOST_REQUIRE(cl.frontend().kick(1).ok());
  wait_completed(cl, last, {0, 1});
  const auto t0 = std::chrono::steady_clock::now();
  auto bases = m.stop_and_copy(o.queues);
  BOOST_REQUIRE_MESSAGE(bases, (bases ? "" : bases.error().message) + "\n" + read_file(a.log));
  Outcome out;
  out.diff_bytes = ram_differences(cl.ram(), dst, out.diff_pages);
  BOOST_TEST_MESSAGE("final round copied " << m.rounds().back().copied << " pages; " << out.diff_pages
                                           << " pages differ between source and destination");
  std::uint64_t ram_pages = 0;
  for (const auto& r : cl.ram().layout()) ram_pages += r.size / kBlock;
  BOOST_TEST(m.rounds().back().copied < ram_pages / 20);  // the logs are not "everything"
  if (!expect_clean) return out;
  BOOST_TEST(out.diff_bytes == 0u, "destination RAM differs from the stopped source in " << out.diff_pages << " pages");

  auto sw = cl.switch_to(b.sock, std::move(dst), *bases);
  BOOST_REQUIRE_MESSAGE(sw.ok(), (sw.ok() ? "" : sw.error().message) + "\n" + read_file(b.log));
  auto st = cl.collect(last, 10000);
  const auto downtime = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
  w.verify(last, "destination, requests in flight at switchover");
  BOOST_TEST_MESSAGE("switchover (stop, final copy, destination start, in-flight requests done): "
                     << downtime.count() << " us");
  a.child->stop(SIGTERM);
  a.child.reset();
  // The driver's allocations moved with its RAM: a new allocation lands past the rings and slots.
  auto fresh = cl.ram().alloc(4096, 4096);
  BOOST_REQUIRE(fresh);
  for (std::uint16_t q = 0; q < o.queues; ++q) BOOST_TEST(*fresh > cl.queue(q).device_gpa());
  // The driver carries on at the destination.
  for (int i = 0; i < 4; ++i) {
    auto ops = w.batch(per_batch);
    st = cl.run(ops);
    BOOST_REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message) + "\n" + read_file(b.log));
    w.verify(ops, "destination");
  }
  auto all = w.read_all();
  BOOST_REQUIRE(cl.run(all).ok());
  w.verify(all, "destination, whole disk");
  // And the disk file itself holds what the guest believes.
  const std::string img = read_file(disk);
  BOOST_REQUIRE_EQUAL(img.size(), kDiskMiB << 20);
  std::uint64_t wrong = 0;
  for (std::uint64_t blk = 0; blk < kBlocks; ++blk) {
    const auto want = pattern(w.seed(blk), kBlock);
    wrong += std::memcmp(img.data() + blk * kBlock, want.data(), kBlock) != 0 ? 1 : 0;
  }
  BOOST_TEST(wrong == 0u);
  BOOST_TEST(w.reads_checked() > 200u);
  out.bad_reads = w.bad_reads();
  BOOST_TEST(out.bad_reads == 0u);
  const std::string blog = read_file(b.log);
  BOOST_TEST(blog.find("dirty logging on") == std::string::npos);  // the destination never logged
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(split_rings_move_to_another_backend_during_checksummed_io) {
  BlkClientOptions o;  // 4 split queues of 128 with event idx
  migrate(o, {}, true);
}

BOOST_AUTO_TEST_CASE(packed_rings_move_to_another_backend_during_checksummed_io) {
  BlkClientOptions o;
  o.packed = true;
  o.queue_size = 100;
  o.indirect = true;
  migrate(o, {}, true);
}

BOOST_AUTO_TEST_CASE(a_backend_write_missing_from_the_dirty_log_is_caught) {
  // The source backend writes the data of reads without logging it: pages the driver then only
  // reads are never copied, and the destination differs from the source.
  BlkClientOptions o;
  const Outcome out = migrate(o, {"--unlogged-reads"}, false);
  BOOST_TEST(out.diff_pages > 0u);
}

BOOST_AUTO_TEST_CASE(a_cancelled_migration_leaves_the_source_running_without_logging) {
  TempDir dir;
  const std::string disk = dir.file("disk.img");
  BackendProc a(dir, "a", disk, {});
  BlkClientOptions o;
  o.queues = 2;
  Started mg = start_migration(a, o);
  BlkClient& cl = *mg.client;
  Workload& w = mg.work;
  BOOST_REQUIRE(mg.mig->precopy().ok());
  BOOST_REQUIRE(mg.mig->cancel().ok());
  BOOST_TEST(!mg.mig->precopy().ok());  // nothing more to do after a cancel
  BOOST_TEST(!cl.frontend().features().has(vhost::VirtioFeature::log_all));
  auto ops = w.batch(24);
  BOOST_REQUIRE(cl.run(ops).ok());
  w.verify(ops, "source after the cancel");
  const std::string log = read_file(a.log);
  BOOST_TEST(log.find("dirty logging on") != std::string::npos);
  BOOST_TEST(log.find("dirty logging off") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(migration_needs_a_source_that_shares_a_dirty_log_and_a_destination_of_the_same_layout) {
  TempDir dir;
  BackendProc a(dir, "a", dir.file("disk.img"), {});
  BlkClientOptions o;
  o.queues = 1;
  auto c = BlkClient::connect(a.sock, o);
  BOOST_REQUIRE(c);
  auto other = vhost::GuestRam::create(vhost::GuestRam::vm_layout(o.ram_mib / 2));
  BOOST_REQUIRE(other);
  auto m = vhost::LiveMigration::begin((*c)->frontend(), (*c)->ram(), *other);
  BOOST_REQUIRE(!m);
  BOOST_TEST(m.error().message.find("layout") != std::string::npos);
  // A frontend that did not ack LOG_SHMFD has no log to share.
  (*c).reset();  // the backend serves one frontend at a time
  auto f = vhost::Frontend::connect(a.sock);
  BOOST_REQUIRE(f);
  auto acked = f->negotiate({vhost::VirtioFeature::version_1, vhost::VirtioFeature::protocol_features},
                            {vhost::ProtocolFeature::reply_ack});
  BOOST_REQUIRE_MESSAGE(acked.ok(), (acked.ok() ? std::string() : acked.error().message) + "\n" + read_file(a.log));
  auto ram = vhost::GuestRam::create(vhost::GuestRam::vm_layout(16)).value();
  auto same = vhost::GuestRam::create(ram.layout()).value();
  auto n = vhost::LiveMigration::begin(*f, ram, same);
  BOOST_REQUIRE(!n);
  BOOST_TEST(n.error().is(Errc::not_supported));
  BOOST_TEST(n.error().message.find("LOG_SHMFD") != std::string::npos);
}
