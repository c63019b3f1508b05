// Guest memory that goes away under the backend (vhost/guest_fault.hpp): a SIGBUS in a guarded
// mapping, on any thread, is absorbed and reported to its sink; one anywhere else still ends the
// process; a sealable memfd is sealed against shrinking when it is mapped.
#define BOOST_TEST_MODULE vhost_guest_fault
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "vrdma/vhost/guest_fault.hpp"
#include "vrdma/vhost/guest_memory.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {
constexpr std::uint64_t kSize = 1 << 20;
// ASan (GCC's or clang's) handles SIGBUS itself: it reports and exits instead of the default action.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
UniqueFd memfd(unsigned flags) {
  UniqueFd fd(::memfd_create("guest-fault-test", MFD_CLOEXEC | flags));
  BOOST_REQUIRE(fd.valid());
  BOOST_REQUIRE(::ftruncate(fd.get(), kSize) == 0);
  return fd;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_shrunk_guarded_region_reads_as_zeros_on_any_thread_and_is_reported) {
  auto sink = FaultSink::create();
  BOOST_REQUIRE(sink.ok());
  UniqueFd fd = memfd(0);  // cannot be sealed
  const int keep = ::dup(fd.get());
  auto region = MappedRegion::map({0x100000, kSize, 0x7000000, 0}, std::move(fd), *sink);
  BOOST_REQUIRE(region.ok());
  BOOST_TEST(!(*region)->sealed());
  auto mem = GuestMemory::build({*region});
  BOOST_REQUIRE(mem.ok());
  GuestView view(*mem, nullptr);
  BOOST_REQUIRE(view.write_obj<std::uint64_t>(0x100000 + 8192, 0x1122334455667788ULL).ok());
  BOOST_REQUIRE(::ftruncate(keep, 4096) == 0);  // the frontend shrinks it: page 0 stays, the rest is gone
  ::close(keep);
  const auto before = guest_faults_absorbed();
  // The engine's thread touches guest memory too.
  std::uint64_t on_thread = 1;
  std::thread([&] { on_thread = view.read_obj<std::uint64_t>(0x100000 + 8192).value(); }).join();
  BOOST_TEST(on_thread == 0u);
  BOOST_TEST(view.read_obj<std::uint64_t>(0x100000 + kSize - 8).value() == 0u);  // already replaced: no new fault
  BOOST_TEST(view.write_obj<std::uint64_t>(0x100000 + 65536, 5).ok());
  BOOST_TEST(view.read_obj<std::uint64_t>(0x100000).ok());  // still the file's page
  const auto rep = (*sink)->take();
  BOOST_TEST(rep.faults == 1u);
  BOOST_TEST(guest_faults_absorbed() - before == 1u);
  BOOST_TEST(std::string(rep.what) == "guest memory");
  const auto host = reinterpret_cast<std::uintptr_t>((*region)->host());
  BOOST_TEST((rep.addr >= host + 8192 && rep.addr < host + 8192 + 8));
  BOOST_TEST((*sink)->take().faults == 0u);
}

BOOST_AUTO_TEST_CASE(a_sigbus_outside_guarded_memory_still_ends_the_process) {
  auto sink = FaultSink::create();
  BOOST_REQUIRE(sink.ok());
  auto guarded = MappedRegion::map({0, kSize, 0x8000000, 0}, memfd(0), *sink);  // the handler is installed
  BOOST_REQUIRE(guarded.ok());
  UniqueFd fd = memfd(0);
  void* p = ::mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd.get(), 0);
  BOOST_REQUIRE(p != MAP_FAILED);
  BOOST_REQUIRE(::ftruncate(fd.get(), 0) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    // Whoever handled SIGBUS before the guard does it here: Boost.Test's own handler would report
    // a failure from this child (ctest runs it with catch_system_errors=no; by hand, the child's
    // output is not the test's).
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    ::dup2(null, 1);
    ::dup2(null, 2);
    volatile std::uint8_t v = *static_cast<volatile std::uint8_t*>(p);  // not guest memory: SIGBUS ends it
    (void)v;
    ::_exit(0);
  }
  int st = 0;
  BOOST_REQUIRE(::waitpid(child, &st, 0) == child);
  // The default action (or a sanitizer's report and exit): never a normal exit.
  BOOST_TEST(!(WIFEXITED(st) && WEXITSTATUS(st) == 0));
  if (!kSanitized && std::getenv("BOOST_TEST_CATCH_SYSTEM_ERRORS") != nullptr)
    BOOST_TEST((WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS));
  ::munmap(p, kSize);
}

BOOST_AUTO_TEST_CASE(a_sealable_memfd_is_sealed_against_shrinking_when_mapped) {
  UniqueFd fd = memfd(MFD_ALLOW_SEALING);
  const int keep = ::dup(fd.get());
  auto r = MappedRegion::map({0, kSize, 0x9000000, 0}, std::move(fd));
  BOOST_REQUIRE(r.ok());
  BOOST_TEST((*r)->sealed());
  BOOST_TEST((::fcntl(keep, F_GET_SEALS) & F_SEAL_SHRINK) != 0);
  BOOST_TEST(::ftruncate(keep, 4096) != 0);
  BOOST_TEST(::ftruncate(keep, 2 * kSize) == 0);  // growing is the frontend's business
  ::close(keep);
  // QEMU's memory-backend-memfd seals itself (seal=on): taken as it is.
  UniqueFd q = memfd(MFD_ALLOW_SEALING);
  BOOST_REQUIRE(::fcntl(q.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) == 0);
  auto qr = MappedRegion::map({0, kSize, 0xa000000, 0}, std::move(q));
  BOOST_REQUIRE(qr.ok());
  BOOST_TEST((*qr)->sealed());
}
