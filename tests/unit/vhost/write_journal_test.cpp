// The write journal (vrdma/vhost/write_journal.hpp) and the guest memory comparison that reads
// it (tests/lib/memcmp.hpp): every write through GuestView is recorded with whether the dirty
// log carried it and whether a ring still ran; a page that differs between two RAM images is
// the backend's when it wrote it after the stop or unlogged during a migration, else the VMM's.
#define BOOST_TEST_MODULE vhost_write_journal
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "memcmp.hpp"
#include "vrdma/vhost/guest_memory.hpp"
#include "vrdma/vhost/guest_ram.hpp"
#include "vrdma/vhost/write_journal.hpp"

using namespace vrdma;
using namespace vrdma::vhost;
namespace j = vrdma::vhost::journal;

namespace {

const std::string& dir() {
  static const std::string d = [] {
    char t[] = "/tmp/vrdma-journal-XXXXXX";
    BOOST_REQUIRE(::mkdtemp(t) != nullptr);
    return std::string(t);
  }();
  return d;
}

// The journal opens once per process, from the environment, at its first use.
const std::string& journal_path() {
  static const std::string p = [] {
    ::setenv("VRDMA_WRITE_JOURNAL", (dir() + "/journal-%p.bin").c_str(), 1);
    BOOST_REQUIRE(j::enabled());
    return dir() + "/journal-" + std::to_string(::getpid()) + ".bin";
  }();
  return p;
}

std::vector<j::Record> records() {
  j::flush();
  std::ifstream f(journal_path(), std::ios::binary);
  std::vector<j::Record> v;
  j::Record r{};
  while (f.read(reinterpret_cast<char*>(&r), sizeof r)) v.push_back(r);
  return v;
}

std::vector<j::Record> writes_at(std::uint64_t gpa) {
  std::vector<j::Record> v;
  for (const auto& r : records())
    if (r.type == static_cast<std::uint8_t>(j::Type::write) && r.gpa == gpa) v.push_back(r);
  return v;
}

struct Ram {
  GuestRam ram;
  std::shared_ptr<const GuestMemory> mem;
  std::shared_ptr<DirtyLog> log;
  static Ram make(std::uint64_t mib) {
    auto r = GuestRam::create({{0, mib << 20, 0}});
    BOOST_REQUIRE(r);
    Ram out{std::move(*r), nullptr, nullptr};
    std::vector<GuestMemory::RegionPtr> v;
    for (const auto& reg : out.ram.table()) {
      auto m = MappedRegion::map(reg, UniqueFd(::dup(out.ram.fd())));
      BOOST_REQUIRE(m);
      v.push_back(*m);
    }
    auto g = GuestMemory::build(v);
    BOOST_REQUIRE(g);
    out.mem = *g;
    // A log covering only the first MiB: writes above it are "not marked".
    UniqueFd lfd(::memfd_create("log", MFD_CLOEXEC));
    BOOST_REQUIRE(::ftruncate(lfd.get(), 4096) == 0);
    auto l = DirtyLog::map(std::move(lfd), 32, 0);
    BOOST_REQUIRE(l);
    out.log = *l;
    return out;
  }
};

void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The files go with the test process.
struct RemoveDir {
  ~RemoveDir() {
    j::flush();
    std::filesystem::remove_all(dir());
  }
};
BOOST_TEST_GLOBAL_FIXTURE(RemoveDir);

}  // namespace

BOOST_AUTO_TEST_CASE(writes_are_recorded_with_their_logging_and_the_stop) {
  journal_path();
  auto r = Ram::make(4);
  const std::uint32_t v = 0x12345678;
  GuestView quiet(r.mem, nullptr), logging(r.mem, r.log);
  j::ring_started(0);
  j::ring_started(1);
  BOOST_REQUIRE(quiet.write_obj(0x1000, v).ok());
  BOOST_REQUIRE(logging.write_obj(0x2000, v).ok());
  BOOST_REQUIRE(logging.write_obj(0x200000, v).ok());  // beyond the 1 MiB the log covers
  j::ring_stopped(0);
  BOOST_REQUIRE(logging.store_u16_release(0x3000, 7).ok());  // ring 1 still runs
  j::ring_stopped(1);
  BOOST_REQUIRE(logging.write_obj(0x4000, v).ok());  // no ring runs: after the stop

  auto w = writes_at(0x1000);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].flags == 0);
  BOOST_TEST(w[0].len == 4u);
  BOOST_TEST(w[0].kind == static_cast<std::uint8_t>(j::Source::backend));
  w = writes_at(0x2000);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].flags == (j::kLogging | j::kLogged));
  w = writes_at(0x200000);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].flags == j::kLogging, "a write past the dirty log is logging but not marked");
  w = writes_at(0x3000);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].flags == (j::kLogging | j::kLogged));
  BOOST_TEST(w[0].len == 2u);
  w = writes_at(0x4000);
  BOOST_REQUIRE_EQUAL(w.size(), 1u);
  BOOST_TEST(w[0].flags == (j::kLogging | j::kLogged | j::kAfterStop));
  // A write after the stop is on disk at once, without a flush.
  std::ifstream f(journal_path(), std::ios::binary | std::ios::ate);
  BOOST_TEST(static_cast<std::size_t>(f.tellg()) == records().size() * sizeof(j::Record));
  // The first record says who keeps it.
  const auto all = records();
  BOOST_TEST(all.front().type == static_cast<std::uint8_t>(j::Type::event));
  BOOST_TEST(all.front().kind == static_cast<std::uint8_t>(j::Event::opened));
  BOOST_TEST(all.front().gpa == static_cast<std::uint64_t>(::getpid()));
  j::ring_started(0);  // the rings run again: later writes are not after the stop
  BOOST_REQUIRE(quiet.write_obj(0x5000, v).ok());
  BOOST_TEST((writes_at(0x5000).at(0).flags & j::kAfterStop) == 0);
  j::ring_stopped(0);
}

BOOST_AUTO_TEST_CASE(a_differing_page_is_the_backends_only_when_it_wrote_it_after_the_stop_or_unlogged) {
  // Its own journal file, written by hand: four pages differ between source and destination.
  const std::string jf = dir() + "/hand.bin", src = dir() + "/src.ram", dst = dir() + "/dst.ram";
  std::vector<j::Record> recs;
  auto add = [&](j::Type t, std::uint8_t kind, std::uint64_t gpa, std::uint64_t len, std::uint8_t flags = 0,
                 std::uint32_t id = 0, std::uint64_t t_ns = 0, std::uint64_t aux = 0) {
    j::Record r{};
    r.t_ns = t_ns;
    r.type = static_cast<std::uint8_t>(t);
    r.kind = kind;
    r.gpa = gpa;
    r.len = len;
    r.flags = flags;
    r.id = id;
    r.aux = aux;
    recs.push_back(r);
  };
  const auto ev = [](j::Event e) { return static_cast<std::uint8_t>(e); };
  const auto be = static_cast<std::uint8_t>(j::Source::backend);
  // The RAM file's offset 0 is guest-physical 0x100000 here.
  add(j::Type::event, ev(j::Event::mem_table), 0, 0, 0, 1);
  add(j::Type::event, ev(j::Event::mem_region), 0x100000, 16 * 4096, 0, 0, 0, 0);
  add(j::Type::event, ev(j::Event::ring_started), 0, 0, 0, 0, 1000);
  add(j::Type::object, static_cast<std::uint8_t>(j::Object::cq_ring), 0x101000, 4096, 0, 3);
  add(j::Type::event, ev(j::Event::logging_on), 0, 0, 0, 0, 2000);
  add(j::Type::write, be, 0x101010, 32, j::kLogging | j::kLogged, 0, 3000);   // page 1: logged
  add(j::Type::write, be, 0x102000, 8, 0, 0, 3500);                           // page 2: unlogged while migrating
  add(j::Type::event, ev(j::Event::ring_stopped), 0, 0, 0, 0, 4000000);
  add(j::Type::write, be, 0x103000, 8, j::kLogging | j::kLogged | j::kAfterStop, 0, 5000000);  // page 3: after the stop
  {
    std::ofstream f(jf, std::ios::binary);
    f.write(reinterpret_cast<const char*>(recs.data()), static_cast<std::streamsize>(recs.size() * sizeof(j::Record)));
  }
  std::vector<std::uint8_t> a(16 * 4096, 0x5a), b = a;
  for (int page : {1, 2, 3, 9}) b[static_cast<std::size_t>(page) * 4096 + 100] ^= 0xff;
  b[9 * 4096 + 101] ^= 0xff;
  write_file(src, a);
  write_file(dst, b);

  auto rep = test::memcmp::compare(src, dst, {jf});
  BOOST_REQUIRE_MESSAGE(rep.ok(), (rep.ok() ? std::string() : rep.error().message));
  BOOST_TEST(rep->pages == 16u);
  BOOST_TEST(rep->differing == 4u);
  BOOST_TEST(rep->backend_pages == 2u);
  BOOST_TEST(rep->vmm_pages() == 2u);
  BOOST_TEST(rep->journal_writes == 3u);
  BOOST_TEST(rep->journal_after_stop == 1u);
  BOOST_REQUIRE_EQUAL(rep->pages_listed.size(), 4u);
  const auto& p1 = rep->pages_listed[0];
  BOOST_TEST(p1.gpa == 0x101000u);
  BOOST_TEST(p1.gpa_known);
  BOOST_TEST(p1.bytes == 1u);
  BOOST_TEST(p1.first == 100u);
  BOOST_TEST(!p1.backend);
  BOOST_REQUIRE_EQUAL(p1.holds.size(), 1u);
  BOOST_TEST(p1.holds[0] == "CQ 3 ring");
  BOOST_TEST(p1.verdict.find("the VMM's") != std::string::npos, p1.verdict);
  BOOST_TEST(rep->pages_listed[1].backend);
  BOOST_TEST(rep->pages_listed[1].unlogged_while_migrating == 1u);
  BOOST_TEST(rep->pages_listed[2].backend);
  BOOST_TEST(rep->pages_listed[2].after_stop == 1u);
  BOOST_REQUIRE(rep->pages_listed[2].last_write_ms.has_value());
  BOOST_TEST(*rep->pages_listed[2].last_write_ms == 1.0, boost::test_tools::tolerance(1e-9));
  const auto& p9 = rep->pages_listed[3];
  BOOST_TEST(p9.bytes == 2u);
  BOOST_TEST(p9.writes == 0u);
  BOOST_TEST(p9.verdict == "the VMM's: the backend never wrote this page");
  BOOST_TEST(rep->text().find("DIFFERS in 4 of 16 pages") != std::string::npos, rep->text());
  BOOST_TEST(rep->json()["backend_pages"] == 2);

  // Identical images: nothing listed; different sizes: refused with the reason.
  auto same = test::memcmp::compare(src, src, {jf});
  BOOST_REQUIRE(same.ok());
  BOOST_TEST(same->differing == 0u);
  BOOST_TEST(same->text().find("identical") != std::string::npos);
  write_file(dst, std::vector<std::uint8_t>(8 * 4096));
  auto diff = test::memcmp::compare(src, dst, {});
  BOOST_REQUIRE(!diff.ok());
  BOOST_TEST(diff.error().message.find("same whole number of pages") != std::string::npos);
  // Not a journal: refused.
  auto bad = test::memcmp::compare(src, src, {src});
  BOOST_REQUIRE(!bad.ok());
  BOOST_TEST(bad.error().message.find("is not a write journal") != std::string::npos);
}
