// Soak (issue 22): a hostile frontend cycles through every attack of frontend_hostile_test
// against one vrdmad for VRDMA_SOAK_SECONDS (60 by default; the issue asks for 600 once, by hand),
// beside a guest on another vrdmad moving checked data the whole time, and a guest of the
// victim's own writing checked data after every round. Zero failed checks; every answer within
// the bound the whole time; the victim's open fds no more and its resident memory within
// 4 MiB of what they were after the first round.
#define BOOST_TEST_MODULE vrdmad_frontend_soak
#include <boost/test/unit_test.hpp>

#include <filesystem>

#include "hostile_frontend.hpp"

using namespace vrdma;
using namespace vrdma::test;
using namespace vrdma::test::hostile;

namespace {

long soak_seconds() {
  const char* e = std::getenv("VRDMA_SOAK_SECONDS");
  return e != nullptr && *e != '\0' ? std::atol(e) : 60;
}

// The victim with no frontend (it has dropped the last one): its fds and memory as they rest.
struct Rest {
  int fds = -1;
  long rss_kib = -1;
};
// A connection the victim is still closing holds an fd or two for a moment after its status
// says it has no frontend. `want_fds` < 0 (the first sample): wait until the count has held still
// for 500 ms (up to 3 s), so a closing connection is not taken for what the victim keeps (CI's
// ASan run once took 19 after the first round and found 18 at the end: fd 15 was still closing).
// `want_fds` >= 0 (the end): wait up to 2 s for the count to come down to it.
Rest at_rest(const Vrdmad& v, int want_fds = -1) {
  for (int i = 0; i < 200; ++i) {
    auto st = v.status();
    if (st.is_object() && st.value("connected", true) == false) break;
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(50ms);
  if (want_fds < 0) {
    int last = v.child->open_fds(), still = 0;
    for (int i = 0; i < 30 && still < 5; ++i) {
      std::this_thread::sleep_for(100ms);
      const int now = v.child->open_fds();
      still = now == last ? still + 1 : 0;
      last = now;
    }
  } else {
    for (int i = 0; i < 20 && v.child->open_fds() > want_fds; ++i) std::this_thread::sleep_for(100ms);
  }
  return {v.child->open_fds(), rss_kib(v.child->pid())};
}

// What the victim's fds are, for a failure message.
std::string fd_list(pid_t pid) {
  std::string out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(dir, std::filesystem::directory_options::skip_permission_denied)) {
    std::error_code ec;
    out += e.path().filename().string() + " -> " + std::filesystem::read_symlink(e.path(), ec).string() + "\n";
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_attack_in_a_loop_beside_a_guest_moving_checked_data) {
  const long seconds = soak_seconds();
  auto& w = World::get();
  auto v = w.victim();
  const auto t0 = Clock::now();
  Watch watch(*v, *w.other, *w.guest);
  long rounds = 0, own_writes = 0;
  auto round = [&] {
    semaphore_kick(*v, 200ms);
    full_call_and_err(*v, 300ms);
    unread_replies(*v, 3000ms);
    drip(*v, 3000ms);
    shrunk_memory(*v, 200ms);
    BOOST_CHECK_MESSAGE(checked_write_on(*v, static_cast<std::uint64_t>(rounds) + 1),
                        "the victim did not serve its own guest after round " << rounds);
    ++own_writes;
    ++rounds;
  };
  round();  // the first round settles what the victim keeps (allocator caches, lazily made fds)
  const Rest before = at_rest(*v);
  while (Clock::now() - t0 < std::chrono::seconds(seconds)) {
    round();
    if (!v->child->alive()) break;
  }
  const Rest after = at_rest(*v, before.fds);
  const auto n = watch.finish();
  BOOST_TEST_MESSAGE("soak: " << ms_since(t0) / 1000 << " s, " << rounds << " rounds of 5 attacks, " << own_writes
                              << " checked writes by the victim's own guest, " << n.writes
                              << " by the other guest (max " << n.write_max_ms << " ms), " << n.probes
                              << " status requests (victim max " << n.victim_max_ms << " ms, other max "
                              << n.other_max_ms << " ms); victim fds " << before.fds << " -> " << after.fds
                              << ", RSS " << before.rss_kib << " -> " << after.rss_kib << " KiB");
  BOOST_CHECK(v->child->alive());
  // A leak is growth. Fewer at the end is something that was still closing after the first
  // round despite the wait above: worth a line in the log, not a failure.
  BOOST_CHECK_MESSAGE(after.fds <= before.fds, "the victim holds " << after.fds << " fds, " << before.fds
                                                << " after the first round:\n" << fd_list(v->child->pid()));
  if (after.fds < before.fds)
    BOOST_TEST_MESSAGE("the victim holds " << after.fds << " fds, " << before.fds << " after the first round:\n"
                                           << fd_list(v->child->pid()));
  if (kSanitized)  // ASan keeps freed memory in quarantine (up to 256 MiB): RSS says nothing there
    BOOST_TEST_MESSAGE("RSS not compared: a sanitizer build");
  else
    BOOST_CHECK_LE(after.rss_kib, before.rss_kib + 4096);
  watch.check("soak");
  no_sanitizer_reports(*v);
}
