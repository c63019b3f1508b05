// The checks on fds a vhost-user frontend passes (vhost/peer_fd.hpp): only eventfds, never a
// semaphore one where the backend reads, always non-blocking afterwards.
#define BOOST_TEST_MODULE vhost_peer_fd
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "vrdma/common/fd.hpp"
#include "vrdma/vhost/peer_fd.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {
UniqueFd efd(std::uint64_t count, int flags) {
  UniqueFd e(::eventfd(0, EFD_CLOEXEC | flags));
  if (count != 0) BOOST_REQUIRE(::write(e.get(), &count, sizeof count) == sizeof count);
  return e;
}
bool nonblocking(int fd) { return (::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }
}  // namespace

BOOST_AUTO_TEST_CASE(a_plain_eventfd_is_taken_and_made_non_blocking) {
  auto e = efd(3, 0);
  BOOST_REQUIRE(!nonblocking(e.get()));
  BOOST_TEST(check_eventfd(e.get(), "SET_VRING_KICK", EventfdUse::read).ok());
  BOOST_TEST(nonblocking(e.get()));
  auto c = efd(0xfffffffffffffffeULL, 0);  // full: a write would block, now it says EAGAIN
  BOOST_TEST(check_eventfd(c.get(), "SET_VRING_CALL", EventfdUse::write).ok());
  const std::uint64_t one = 1;
  BOOST_TEST(::write(c.get(), &one, sizeof one) == -1);
  BOOST_TEST(errno == EAGAIN);
}

BOOST_AUTO_TEST_CASE(a_semaphore_eventfd_is_refused_where_the_backend_reads_it) {
  for (std::uint64_t count : {0ULL, 1ULL, 2ULL, 0xfffffffffffffffeULL}) {
    BOOST_TEST_CONTEXT("count " << count) {
      auto s = efd(count, EFD_SEMAPHORE | EFD_NONBLOCK);
      auto st = check_eventfd(s.get(), "SET_VRING_KICK", EventfdUse::read);
      BOOST_TEST(!st.ok());
      if (!st.ok()) BOOST_TEST(st.error().message.find("semaphore") != std::string::npos);
      // Without fdinfo's line (kernels before 6.3) the probe tells it too.
      auto probe = is_semaphore_eventfd(s.get(), true);
      BOOST_TEST((probe.ok() && *probe));
      auto plain = efd(count, EFD_NONBLOCK);
      auto pp = is_semaphore_eventfd(plain.get(), true);
      BOOST_TEST((pp.ok() && !*pp));
    }
  }
  // Where the backend only writes (call, err), a semaphore eventfd is as good as any.
  auto s = efd(0, EFD_SEMAPHORE);
  BOOST_TEST(check_eventfd(s.get(), "SET_VRING_CALL", EventfdUse::write).ok());
}

BOOST_AUTO_TEST_CASE(what_is_not_an_eventfd_is_refused_with_what_it_is) {
  int p[2];
  BOOST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  auto st = check_eventfd(w.get(), "SET_VRING_CALL for vring 0", EventfdUse::write);
  BOOST_REQUIRE(!st.ok());
  BOOST_TEST(st.error().message.find("SET_VRING_CALL for vring 0: its fd is pipe:[") == 0);
  BOOST_TEST(!nonblocking(w.get()));  // refused fds are left as they were
  UniqueFd m(::memfd_create("not-an-eventfd", MFD_CLOEXEC));
  BOOST_TEST(!check_eventfd(m.get(), "SET_VRING_KICK", EventfdUse::read).ok());
  int sv[2];
  BOOST_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  BOOST_TEST(!check_eventfd(a.get(), "SET_VRING_ERR", EventfdUse::write).ok());
  BOOST_TEST(!check_eventfd(-1, "SET_VRING_KICK", EventfdUse::read).ok());
}

// A frontend can clear O_NONBLOCK again on the description it shares: reads and writes of its
// fds still never hold the backend for longer than kPeerIoLimit.
BOOST_AUTO_TEST_CASE(peer_io_on_a_blocking_fd_is_cut_off) {
  auto empty = efd(0, 0);  // blocking
  std::uint64_t v = 0;
  auto t0 = std::chrono::steady_clock::now();
  BOOST_TEST(peer_read(empty.get(), &v, sizeof v) == -1);
  BOOST_TEST((errno == EAGAIN || errno == ETIMEDOUT));  // RWF_NOWAIT: at once; else the watchdog
  auto full = efd(0xfffffffffffffffeULL, 0);
  const std::uint64_t one = 1;
  t0 = std::chrono::steady_clock::now();
  BOOST_TEST(peer_write(full.get(), &one, sizeof one) == -1);
  BOOST_TEST(errno == ETIMEDOUT);
  const auto took = std::chrono::steady_clock::now() - t0;
  BOOST_TEST(took >= kPeerIoLimit);
  BOOST_TEST(took < kPeerIoLimit * 4);
  // And as usual otherwise.
  auto ok = efd(0, 0);
  BOOST_TEST(peer_write(ok.get(), &one, sizeof one) == static_cast<ssize_t>(sizeof one));
  BOOST_TEST(peer_read(ok.get(), &v, sizeof v) == static_cast<ssize_t>(sizeof v));
  BOOST_TEST(v == 1u);
  int p[2];
  BOOST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  BOOST_TEST(peer_read(r.get(), &v, sizeof v) == -1);  // an empty blocking pipe
  BOOST_TEST((errno == EAGAIN || errno == ETIMEDOUT));
}
