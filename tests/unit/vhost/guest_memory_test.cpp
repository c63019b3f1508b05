#define BOOST_TEST_MODULE vhost_guest_memory
#include <boost/test/unit_test.hpp>
#include <sys/mman.h>
#include <unistd.h>

#include "vrdma/vhost/guest_memory.hpp"
#include "vrdma/vhost/guest_ram.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {

// Backend-side view of a GuestRam, mapped from its fd exactly as SET_MEM_TABLE would.
std::shared_ptr<const GuestMemory> map_all(const GuestRam& ram) {
  std::vector<GuestMemory::RegionPtr> v;
  for (const auto& r : ram.table()) {
    auto m = MappedRegion::map(r, UniqueFd(::dup(ram.fd())));
    BOOST_REQUIRE(m);
    v.push_back(*m);
  }
  auto g = GuestMemory::build(v);
  BOOST_REQUIRE(g);
  return *g;
}

}  // namespace

BOOST_AUTO_TEST_CASE(translation_honours_holes_and_fd_offsets) {
  auto ram = GuestRam::create(GuestRam::vm_layout(16));
  BOOST_REQUIRE(ram);
  auto mem = map_all(*ram);
  const auto& lay = ram->layout();
  BOOST_REQUIRE(lay.size() == 3u);
  BOOST_TEST(lay[1].fd_offset != 0u);
  // Write through the frontend's mapping, read through the backend's.
  std::memcpy(ram->host(lay[1].gpa + 123, 5), "hello", 5);
  std::memcpy(ram->host(lay[2].gpa, 5), "world", 5);
  GuestView g(mem, nullptr);
  char buf[6] = {};
  BOOST_REQUIRE(g.read(lay[1].gpa + 123, buf, 5).ok());
  BOOST_TEST(std::string(buf) == "hello");
  BOOST_REQUIRE(g.read(lay[2].gpa, buf, 5).ok());
  BOOST_TEST(std::string(buf) == "world");
  // The hole between 640 KiB and 1 MiB and anything past the top are outside.
  BOOST_TEST(!mem->at(0xa0000).ok());
  BOOST_TEST(!mem->at(lay[2].gpa + lay[2].size).ok());
  BOOST_TEST(!mem->range(lay[0].size - 4, 8).ok());  // runs off the end of region 0
  BOOST_TEST(!g.read(UINT64_MAX - 2, buf, 5).ok());   // wraps
  // A failed write leaves memory untouched.
  BOOST_TEST(!g.write(lay[0].size - 2, "abcd", 4).ok());
  BOOST_TEST(*ram->host(lay[0].size - 2, 1) == 0);
}

BOOST_AUTO_TEST_CASE(uaddr_translation_for_ring_addresses) {
  auto ram = GuestRam::create(GuestRam::vm_layout(16));
  BOOST_REQUIRE(ram);
  auto mem = map_all(*ram);
  const auto t = ram->table();
  auto gpa = mem->uaddr_to_gpa(t[1].userspace_addr + 4096, 64);
  BOOST_REQUIRE(gpa);
  BOOST_TEST(*gpa == t[1].guest_phys_addr + 4096);
  BOOST_TEST(!mem->uaddr_to_gpa(t[1].userspace_addr + t[1].memory_size - 8, 64).ok());
  BOOST_TEST(!mem->uaddr_to_gpa(0x10, 1).ok());
}

BOOST_AUTO_TEST_CASE(regions_are_checked_against_their_fd_and_each_other) {
  UniqueFd fd(::memfd_create("t", MFD_CLOEXEC));
  BOOST_REQUIRE(::ftruncate(fd.get(), 1 << 20) == 0);
  BOOST_TEST(!MappedRegion::map({0, 2 << 20, 0x1000000, 0}, UniqueFd(::dup(fd.get()))).ok());  // beyond EOF
  BOOST_TEST(!MappedRegion::map({0, 4096, 0x1000000, 100}, UniqueFd(::dup(fd.get()))).ok());   // unaligned offset
  BOOST_TEST(!MappedRegion::map({0, 0, 0x1000000, 0}, UniqueFd(::dup(fd.get()))).ok());        // empty
  BOOST_TEST(!MappedRegion::map({UINT64_MAX - 10, 4096, 0, 0}, UniqueFd(::dup(fd.get()))).ok());  // wraps
  auto a = MappedRegion::map({0, 1 << 19, 0x1000000, 0}, UniqueFd(::dup(fd.get())));
  auto b = MappedRegion::map({1 << 18, 1 << 18, 0x2000000, 1 << 19}, UniqueFd(::dup(fd.get())));
  BOOST_REQUIRE(a && b);
  BOOST_TEST(!GuestMemory::build({*a, *b}).ok());  // gpa overlap
}

BOOST_AUTO_TEST_CASE(whole_table_swap_keeps_the_old_table_valid) {
  auto ram = GuestRam::create(GuestRam::vm_layout(16));
  BOOST_REQUIRE(ram);
  auto old = map_all(*ram);
  GuestView held(old, nullptr);
  auto smaller = old->without(old->regions()[2]->desc());
  BOOST_REQUIRE(smaller);
  BOOST_TEST((*smaller)->regions().size() == 2u);
  BOOST_TEST(!(*smaller)->at(ram->layout()[2].gpa).ok());
  // The holder of the old table still reads the removed region safely.
  std::memcpy(ram->host(ram->layout()[2].gpa, 3), "abc", 3);
  char b[4] = {};
  BOOST_TEST(held.read(ram->layout()[2].gpa, b, 3).ok());
  BOOST_TEST(std::string(b) == "abc");
  auto back = (*smaller)->with(old->regions()[2]);
  BOOST_REQUIRE(back);
  BOOST_TEST((*back)->at(ram->layout()[2].gpa).ok());
}

BOOST_AUTO_TEST_CASE(dirty_log_marks_exactly_the_written_pages) {
  auto ram = GuestRam::create(GuestRam::vm_layout(16));
  BOOST_REQUIRE(ram);
  auto mem = map_all(*ram);
  const std::uint64_t bytes = 64;  // covers 512 pages = 2 MiB
  UniqueFd lfd(::memfd_create("log", MFD_CLOEXEC));
  BOOST_REQUIRE(::ftruncate(lfd.get(), 4096) == 0);
  auto log = DirtyLog::map(UniqueFd(::dup(lfd.get())), bytes, 0);
  BOOST_REQUIRE(log);
  auto* bits = static_cast<std::uint8_t*>(::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, lfd.get(), 0));
  GuestView g(mem, *log);
  BOOST_REQUIRE(g.write(0x100000 + 4095, "xy", 2).ok());  // straddles pages 256 and 257
  BOOST_TEST(bits[32] == 0x03);
  BOOST_TEST(bits[31] == 0);
  BOOST_TEST(bits[33] == 0);
  BOOST_REQUIRE(g.store_u16_release(0x1000, 7).ok());  // page 1
  BOOST_TEST(bits[0] == 0x02);
  // Above the log's reach: counted, never written.
  BOOST_REQUIRE(g.write(ram->layout()[2].gpa, "z", 1).ok());
  BOOST_TEST((*log)->overflow() == 1u);
  GuestView unlogged(mem, nullptr);
  BOOST_REQUIRE(unlogged.write(0x100000 + 3 * 4096, "q", 1).ok());
  BOOST_TEST(bits[32] == 0x03);
  ::munmap(bits, 4096);
}
