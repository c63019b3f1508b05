// Live migration of the virtio RDMA device with open RC connections, the peer unmodified.
//
// Four network namespaces on one bridge: "switch" (the bridge, where nftables may drop
// packets), host A and host B (each with an interface for the guest: same MAC, same address
// 10.66.0.1, and a management link between them for the switchover stream), and the peer
// (10.66.0.2, a plain soft engine in this process). The guest is libpvverbs in this process:
// its device runs on vrdmad A, moves to vrdmad B (started with --incoming) and back to a new
// vrdmad on A, while SENDs flow both ways and RDMA WRITEs with immediate flow to the peer, all
// checksummed; every work request completes exactly once, in order. Then the failures: a
// destination that refuses the guest, one that dies before the switchover, one that rejects
// the state: the guest carries on at the source each time, nothing lost.
#define BOOST_TEST_MODULE migration_switchover
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "rdma_pair.hpp"
#include "rdma_stream.hpp"
#include "vrdma/common/bytes.hpp"
#include "vrdma/migration/stream.hpp"
#include "vrdma/migration/device_state.hpp"
#include "vrdma/common/version.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/guest/pv.hpp"
#include "fabric.hpp"
#include "vrdmad_proc.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using namespace vrdma::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::shared_ptr<Device> soft_engine_in(const std::string& ns, const std::string& ip) {
  std::shared_ptr<Device> soft;
  BOOST_REQUIRE(run_in_netns(ns, [&] {
    auto d = open_device("soft:" + ip);
    if (d) soft = *d;
  }));
  BOOST_REQUIRE_MESSAGE(soft, "cannot open soft:" + ip + " in " + ns);
  return soft;
}

// Checked traffic on one RC connection (rdma_stream.hpp): side 0 the guest, side 1 the peer.
struct Stream {
  StreamSide side[2];
  Stream(Endpoint& guest, Endpoint& peer, std::size_t n)
      : side{StreamSide(guest, 0, n, peer.mr->addr(), peer.mr->rkey()), StreamSide(peer, 1, n, guest.mr->addr(), guest.mr->rkey())} {
    for (auto& x : side) VRDMA_REQUIRE_OK(x.start());
  }
  [[nodiscard]] bool done() const { return side[0].done() && side[1].done(); }
  [[nodiscard]] std::size_t sent() const { return side[0].sent(); }
  [[nodiscard]] std::size_t in_flight() const {
    return side[0].sent() - side[0].send_done() + side[1].sent() - side[1].send_done();
  }
  [[nodiscard]] std::size_t msgs() const { return side[0].msgs(); }
  [[nodiscard]] double longest_gap_ms() const { return std::max(side[0].longest_gap_ms(), side[1].longest_gap_ms()); }
  // Runs until `until` says stop (or done), bounded in time.
  template <class F>
  void run_until(F until, std::chrono::seconds limit = 120s) {
    const auto deadline = Clock::now() + limit;
    while (!done() && !until() && Clock::now() < deadline)
      for (auto& x : side) VRDMA_REQUIRE_OK(x.step());
    BOOST_REQUIRE_MESSAGE(Clock::now() < deadline, "the stream made no progress for " << limit.count() << " s: sent "
                                                       << side[0].sent() << "/" << side[1].sent() << " done "
                                                       << side[0].send_done() << "/" << side[1].send_done()
                                                       << " received " << side[0].received() << "/" << side[1].received());
  }
  void finish() {
    run_until([] { return false; });
    BOOST_CHECK(done());
  }
};

nlohmann::json wait_phase(const Vrdmad& d, const std::string& phase, std::chrono::milliseconds limit = 5000ms) {
  auto st = wait_for_phase(d.ctl, phase, limit);
  if (phase_of(st) != phase)
    BOOST_ERROR("vrdmad " << d.sock << " did not reach phase " << phase << ": " << st.dump() << "\nlog:\n" << read_file(d.log));
  return st;
}

// The destination announces the guest's one address off its event loop: 3 gratuitous ARPs at
// once, then one each 50, 150, 300 and 500 ms later.
bool wait_garps(const Vrdmad& d) {
  const auto deadline = Clock::now() + 3s;
  int n = 0;
  while (Clock::now() < deadline) {
    n = d.status()["migration"]["garps"].get<int>();
    if (n >= 7) return true;
    std::this_thread::sleep_for(20ms);
  }
  BOOST_TEST_MESSAGE("vrdmad " << d.sock << " sent " << n << " gratuitous ARPs, not 7");
  return false;
}

std::vector<std::string> incoming_args(const std::string& addr, const std::string& ifname) {
  return {"--incoming", addr, "--announce", ifname, "--mac", kGuestMac};
}

struct Guest {
  Fabric& net;
  TempDir dir;
  std::unique_ptr<Vrdmad> here;
  std::shared_ptr<Device> dev, peer;
  PairOptions o;
  std::optional<Endpoint> a, b;
  explicit Guest(Fabric& f, std::vector<std::string> extra = {}) : net(f) {
    std::vector<std::string> args{"--announce", "gA", "--mac", kGuestMac};
    args.insert(args.end(), extra.begin(), extra.end());
    here = std::make_unique<Vrdmad>(dir, "a", net.a, std::string("soft:") + kGuestIp, args);
    auto d = open_device(here->device() + "?ram_mib=64");
    VRDMA_REQUIRE_OK(d);
    dev = *d;
    peer = soft_engine_in(net.p, kPeerIp);
    o.buf_bytes = 2u << 20;
    o.timeout = 14;  // ~67 ms local ACK timeout, 7 retries: the peer waits out a pause of ~0.5 s
    o.retry_cnt = 7;
    auto ea = make_endpoint(dev, o);
    VRDMA_REQUIRE_OK(ea);
    auto eb = make_endpoint(peer, o);
    VRDMA_REQUIRE_OK(eb);
    a.emplace(std::move(*ea));
    b.emplace(std::move(*eb));
    VRDMA_REQUIRE_OK(connect(*a, *b, o));
  }
};

// Polls `cq` until a poll fails, as one does when the driver has lost the device (at most 5 s);
// the last poll's result.
Result<std::size_t> poll_until_error(CompletionQueue& cq) {
  std::array<WorkCompletion, 4> wcs;
  Result<std::size_t> polled = std::size_t{0};
  for (int i = 0; i < 500 && polled.ok(); ++i) {
    polled = cq.poll(wcs);
    if (polled.ok()) std::this_thread::sleep_for(10ms);
  }
  return polled;
}

// The backend a supervised vrdmad (--supervise) runs: its only child; 0 while it has none.
pid_t supervised_backend(pid_t supervisor) {
  const std::string l = read_file("/proc/" + std::to_string(supervisor) + "/task/" + std::to_string(supervisor) + "/children");
  return l.empty() ? 0 : static_cast<pid_t>(std::atol(l.c_str()));
}

// Kills the supervised backend with SIGKILL and waits until its successor (another pid) answers
// status on the control socket; returns the successor, 0 when none came within 30 s.
pid_t kill_and_wait_for_restart(const Vrdmad& d) {
  const pid_t old = supervised_backend(d.child->pid());
  if (old == 0) return 0;
  ::kill(old, SIGKILL);
  const auto deadline = Clock::now() + 30s;
  while (Clock::now() < deadline) {
    const pid_t now = supervised_backend(d.child->pid());
    if (now != 0 && now != old && d.status().is_object()) return now;
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(guest_moves_a_to_b_and_back_with_traffic_and_packet_loss) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net(2);
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge (nftables?)");
  Guest g(net);
  const std::uint32_t qpn = g.a->qp->qp_num(), rkey = g.a->mr->rkey();
  Stream s(*g.a, *g.b, 900);

  struct Move {
    std::string to_ns, to_if, addr;
  };
  const Move moves[] = {{net.b, "gB", "tcp:10.67.0.2:7811"}, {net.a, "gA", "tcp:10.67.0.1:7812"}};
  int n = 0;
  for (const auto& m : moves) {
    ++n;
    s.run_until([&] { return s.sent() >= s.msgs() * n / 3; });
    BOOST_TEST_CONTEXT("move " << n << " to " << m.to_ns) {
      auto dst = std::make_unique<Vrdmad>(g.dir, "dst" + std::to_string(n), m.to_ns, std::string("soft:") + kGuestIp,
                                          incoming_args(m.addr, m.to_if));
      BOOST_CHECK_EQUAL(dst->status()["migration"]["phase"], "incoming");
      auto r = g.here->control({{"cmd", "migrate"}, {"to", m.addr}});
      BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
      BOOST_CHECK_EQUAL(r["migration"]["phase"], "armed");
      const auto in_flight = s.in_flight();
      const auto t0 = Clock::now();
      VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock));
      const double switch_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      auto src_st = wait_phase(*g.here, "migrated");
      auto dst_st = wait_phase(*dst, "running");
      BOOST_CHECK(wait_garps(*dst));
      BOOST_CHECK_EQUAL(dst_st["objects"]["qp"].get<int>(), 1);
      BOOST_CHECK_EQUAL(src_st["objects"]["qp"].get<int>(), 0);  // the source let go of everything
      // Its PD, CQ(s) and QP were built from the PRESTATE layout before the state arrived.
      BOOST_CHECK_GE(dst_st["adopted"].get<int>(), 3);
      BOOST_CHECK_EQUAL(dst_st["precreated"].get<int>(), 0);
      BOOST_TEST_MESSAGE("move " << n << ": switched in " << switch_ms << " ms with " << in_flight
                                 << " work requests in flight; state " << src_st["migration"]["state_bytes"]
                                 << " bytes, saved in " << src_st["migration"]["save_ms"] << " ms, loaded in "
                                 << dst_st["migration"]["load_ms"] << " ms, rings stopped -> destination active "
                                 << src_st["migration"]["stop_to_active_ms"] << " ms");
      g.here->child->stop(SIGTERM);
      g.here = std::move(dst);
    }
  }
  s.finish();
  const long lost = net.dropped();
  BOOST_TEST_MESSAGE("longest pause between completions: " << s.longest_gap_ms() << " ms; the switch dropped " << lost
                                                              << " RoCE packets");
  BOOST_CHECK_GT(lost, 0);
  BOOST_CHECK_EQUAL(g.a->qp->qp_num(), qpn);  // the same handles after two moves
  BOOST_CHECK_EQUAL(g.a->mr->rkey(), rkey);
}

// With a migration engine on both sides (vrdmad --migration-engine, here the soft engine on each
// host's migration address) the device state goes as an RDMA WRITE into a buffer the destination
// exposed in HELLO_OK, and STATE_WRITTEN (size + CRC-32) says so over TCP. A destination without
// one gets it over TCP. Traffic is checked across both moves.
BOOST_AUTO_TEST_CASE(the_state_goes_over_rdma_when_both_have_a_migration_engine_and_over_tcp_otherwise) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  Guest g(net, {"--migration-engine", "soft:10.67.0.1"});
  Stream s(*g.a, *g.b, 600);
  s.run_until([&] { return s.sent() >= 200; });
  {
    auto args = incoming_args("tcp:10.67.0.2:7851", "gB");
    args.insert(args.end(), {"--migration-engine", "soft:10.67.0.2"});
    auto dst = std::make_unique<Vrdmad>(g.dir, "rdma", net.b, std::string("soft:") + kGuestIp, args);
    auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7851"}});
    BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
    VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock));
    auto src_st = wait_phase(*g.here, "migrated");
    auto dst_st = wait_phase(*dst, "running");
    BOOST_CHECK_EQUAL(src_st["migration"]["state_via"], "rdma");
    BOOST_CHECK_EQUAL(dst_st["migration"]["state_via"], "rdma");
    BOOST_CHECK_EQUAL(dst_st["objects"]["qp"].get<int>(), 1);
    const std::string dlog = read_file(dst->log);
    BOOST_CHECK_MESSAGE(dlog.find("over RDMA") != std::string::npos, dlog);
    BOOST_TEST_MESSAGE("the state went over RDMA: " << src_st["migration"]["state_bytes"] << " bytes");
    g.here->child->stop(SIGTERM);
    g.here = std::move(dst);
  }
  s.run_until([&] { return s.sent() >= 400; });
  {
    // Back to a host whose vrdmad has no migration engine: TCP, said in the source's log.
    auto dst = std::make_unique<Vrdmad>(g.dir, "tcp", net.a, std::string("soft:") + kGuestIp,
                                        incoming_args("tcp:10.67.0.1:7852", "gA"));
    auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.1:7852"}});
    BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
    VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock));
    auto src_st = wait_phase(*g.here, "migrated");
    auto dst_st = wait_phase(*dst, "running");
    BOOST_CHECK_EQUAL(src_st["migration"]["state_via"], "tcp");
    BOOST_CHECK_EQUAL(dst_st["migration"]["state_via"], "tcp");
    const std::string slog = read_file(g.here->log);
    BOOST_CHECK_MESSAGE(slog.find("the state goes over TCP (tcp:10.67.0.1:7852 has no migration engine)") !=
                            std::string::npos,
                        slog);
    g.here->child->stop(SIGTERM);
    g.here = std::move(dst);
  }
  s.finish();
}

// The destination builds the engine objects from the layout the source sends with HELLO
// (PRESTATE) while the guest runs on; what the guest creates after that is built when the state
// arrives, and what was built for nothing (an object the guest destroyed meanwhile) is freed.
// Every QP carries checked traffic after the move.
BOOST_AUTO_TEST_CASE(objects_made_or_destroyed_after_the_layout_went_are_handled_at_the_stop) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge (nftables?)");
  Guest g(net);
  const auto objects = [&] {
    const auto o = g.here->status()["objects"];
    return o["pd"].get<int>() + o["cq"].get<int>() + o["qp"].get<int>();
  };
  const int first_pair = objects();
  // A second guest endpoint now, destroyed after the layout went.
  std::optional<Endpoint> gone;
  {
    auto e = make_endpoint(g.dev, g.o);
    VRDMA_REQUIRE_OK(e);
    gone.emplace(std::move(*e));
  }
  const int before = objects();
  auto dstp = std::make_unique<Vrdmad>(g.dir, "ahead", net.b, std::string("soft:") + kGuestIp,
                                       incoming_args("tcp:10.67.0.2:7841", "gB"));
  Vrdmad& dst = *dstp;
  auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7841"}});
  BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
  int built = 0;
  for (int i = 0; i < 500 && (built = dst.status()["precreated"].get<int>()) < before; ++i)
    std::this_thread::sleep_for(10ms);
  BOOST_REQUIRE_EQUAL(built, before);  // the first pair's objects and those about to go
  BOOST_CHECK_EQUAL(dst.status()["objects"]["qp"].get<int>(), 0);  // built, not in use yet
  gone.reset();
  auto na = make_endpoint(g.dev, g.o);  // a third pair, after the layout went
  VRDMA_REQUIRE_OK(na);
  auto nb = make_endpoint(g.peer, g.o);
  VRDMA_REQUIRE_OK(nb);
  VRDMA_REQUIRE_OK(connect(*na, *nb, g.o));

  VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst.sock));
  auto st = wait_phase(dst, "running");
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 2);
  BOOST_CHECK_EQUAL(st["precreated"].get<int>(), 0);  // the unused ones are freed
  BOOST_CHECK_EQUAL(st["adopted"].get<int>(), first_pair);
  BOOST_CHECK_MESSAGE(read_file(dst.log).find("left unused") != std::string::npos, read_file(dst.log));
  Stream s1(*g.a, *g.b, 200), s2(*na, *nb, 200);
  const auto deadline = Clock::now() + 120s;
  while (!(s1.done() && s2.done()) && Clock::now() < deadline) {
    for (auto& x : s1.side) VRDMA_REQUIRE_OK(x.step());
    for (auto& x : s2.side) VRDMA_REQUIRE_OK(x.step());
  }
  BOOST_CHECK(s1.done());
  BOOST_CHECK(s2.done());
  g.here->child->stop(SIGTERM);
  g.here = std::move(dstp);  // the guest's endpoints are destroyed where the device now runs
}

namespace {

// From inside the source's namespace, a hand-made source: connects to the destination at
// 10.67.0.2:`port` and says HELLO with the guest's identity and device state `version`; -1 when
// it cannot connect.
int hello_to(std::uint16_t port, std::uint32_t version, const char* source) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "10.67.0.2", &a.sin_addr);
  if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (s >= 0) ::close(s);
    return -1;
  }
  migration::Hello h;
  h.gid = std::string("::ffff:") + kGuestIp;
  h.mac = kGuestMac;
  h.engine = "soft";
  h.state_version = version;
  h.source = source;
  h.release = "9.9.9";
  const auto f = migration::encode(migration::FrameType::hello, migration::encode_hello(h));
  (void)::send(s, f.data(), f.size(), MSG_NOSIGNAL);
  return s;
}

// The first frame the destination sends on `s`, within 5 s.
std::optional<migration::Frame> first_frame(int s) {
  migration::FrameReader r;
  for (int i = 0; i < 50; ++i) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    std::uint8_t buf[4096];
    const ssize_t n = ::recv(s, buf, sizeof buf, 0);
    if (n <= 0) break;
    r.feed(std::span(buf, static_cast<std::size_t>(n)));
    if (auto f = r.next(); f && f->has_value()) return std::move(**f);
  }
  return std::nullopt;
}

}  // namespace

// A source that sends a broken or oversized object layout (PRESTATE) after HELLO_OK: the
// destination says so in its log, builds nothing and keeps waiting; a real migration to it then
// works, with the objects built ahead from the good layout.
BOOST_AUTO_TEST_CASE(a_bad_object_layout_builds_nothing_and_the_destination_carries_on) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge (nftables?)");
  Guest g(net);
  auto dstp = std::make_unique<Vrdmad>(g.dir, "badlayout", net.b, std::string("soft:") + kGuestIp,
                                       incoming_args("tcp:10.67.0.2:7851", "gB"));
  bool said_ok = false;
  BOOST_REQUIRE(run_in_netns(net.a, [&] {
    const int s = hello_to(7851, migration::DeviceState::kStateVersion, "a hostile test source");
    if (s < 0) return;
    auto put = [&](const std::vector<std::uint8_t>& f) { (void)::send(s, f.data(), f.size(), MSG_NOSIGNAL); };
    const auto f = first_frame(s);
    said_ok = f && f->type == migration::FrameType::hello_ok && f->text().find("\"prestate\":true") != std::string::npos;
    // Garbage, then a layout whose QP names a PD and CQs it does not have, then one asking
    // for more PDs than the destination's limit.
    const std::vector<std::uint8_t> junk{1, 2, 3, 4, 5, 6, 7};
    put(migration::encode(migration::FrameType::prestate, junk));
    ByteWriter w;
    w.put(std::uint32_t{0x4c445256});
    w.put(migration::DeviceState::kStateVersion);
    w.put(std::uint32_t{0});  // no PDs
    w.put(std::uint32_t{0});  // no CQs
    w.put(std::uint32_t{1});  // one QP, in PD 7 with CQs 8 and 9
    for (std::uint32_t v : {1u, 7u, 8u, 9u}) w.put(v);
    w.put(std::uint8_t{2});
    w.put(std::uint8_t{0});
    for (std::uint32_t v : {16u, 16u, 1u, 1u, 0u, 0x1234u}) w.put(v);
    put(migration::encode(migration::FrameType::prestate, w.out));
    ByteWriter many;
    many.put(std::uint32_t{0x4c445256});
    many.put(migration::DeviceState::kStateVersion);
    many.put(std::uint32_t{1u << 30});
    put(migration::encode(migration::FrameType::prestate, many.out));
    std::this_thread::sleep_for(300ms);
    ::close(s);
  }));
  BOOST_REQUIRE_MESSAGE(said_ok, "the destination did not answer HELLO with HELLO_OK {\"prestate\":true}");
  nlohmann::json st;
  for (int i = 0; i < 300; ++i) {
    st = dstp->status();
    if (st.is_object() && st["migration"]["phase"] == "incoming" &&
        read_file(dstp->log).find("before the device state arrived") != std::string::npos)
      break;
    std::this_thread::sleep_for(10ms);
  }
  BOOST_CHECK_EQUAL(st["precreated"].get<int>(), 0);
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 0);
  const std::string log = read_file(dstp->log);
  std::size_t said = 0;
  for (auto p = log.find("could not build the guest's objects ahead"); p != std::string::npos;
       p = log.find("could not build the guest's objects ahead", p + 1))
    ++said;
  BOOST_CHECK_MESSAGE(said == 3, "the destination's log says it built nothing " << said << " times, not 3:\n" << log);

  // The destination still takes the guest, objects built ahead.
  auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7851"}});
  BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
  VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dstp->sock));
  st = wait_phase(*dstp, "running");
  BOOST_CHECK_GE(st["adopted"].get<int>(), 3);
  Stream s1(*g.a, *g.b, 100);
  s1.finish();
  g.here->child->stop(SIGTERM);
  g.here = std::move(dstp);
}

// A source one release older (it sends device state version kOldestStateVersion) is taken: a
// destination reads every version from that one to its own (hosts are upgraded one at a time);
// a source newer than the destination is refused with the reason, and nothing changes there.
BOOST_AUTO_TEST_CASE(a_source_of_an_older_state_version_is_taken_and_a_newer_one_refused) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge (nftables?)");
  Guest g(net);
  Vrdmad dst(g.dir, "versions", net.b, std::string("soft:") + kGuestIp, incoming_args("tcp:10.67.0.2:7861", "gB"));
  // The first frame the destination answers a HELLO of `version` with: its type and text.
  auto answer = [&](std::uint32_t version) {
    std::pair<int, std::string> out{-1, ""};
    BOOST_REQUIRE(run_in_netns(net.a, [&] {
      const int s = hello_to(7861, version, "a test source of another release");
      if (s < 0) return;
      if (const auto f = first_frame(s)) out = {static_cast<int>(f->type), f->text()};
      ::close(s);
    }));
    return out;
  };
  const auto newer = answer(migration::DeviceState::kStateVersion + 1);
  BOOST_TEST(newer.first == static_cast<int>(migration::FrameType::refuse), "answer " << newer.first << ": " << newer.second);
  BOOST_TEST(newer.second.find("version") != std::string::npos, newer.second);
  // The sentence names both releases: the source's (from its HELLO) and this vrdmad's.
  BOOST_TEST(newer.second.find("(vrdma 9.9.9)") != std::string::npos, newer.second);
  BOOST_TEST(newer.second.find("(vrdma " + std::string(vrdma::version()) + ")") != std::string::npos, newer.second);
  const auto older = answer(migration::DeviceState::kOldestStateVersion);
  BOOST_TEST(older.first == static_cast<int>(migration::FrameType::hello_ok), "answer " << older.first << ": " << older.second);
  BOOST_TEST(migration::DeviceState::kOldestStateVersion < migration::DeviceState::kStateVersion);
}

BOOST_AUTO_TEST_CASE(failed_migrations_leave_the_guest_running_at_the_source) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE(net.ok);
  Guest g(net);
  Stream s(*g.a, *g.b, 600);
  s.run_until([&] { return s.sent() >= 100; });

  // 1. A destination that is not the guest's (another MAC) refuses it at once, with the reason.
  {
    Vrdmad dst(g.dir, "wrongmac", net.b, std::string("soft:") + kGuestIp,
               {"--incoming", "tcp:10.67.0.2:7821", "--announce", "gB", "--mac", "52:54:00:99:99:99"});
    auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7821"}});
    BOOST_CHECK(r["ok"] == false);
    BOOST_CHECK_MESSAGE(r["error"].get<std::string>().find("MAC") != std::string::npos, r.dump());
    BOOST_CHECK_EQUAL(g.here->status()["migration"]["phase"], "idle");
  }
  s.run_until([&] { return s.sent() >= 200; });

  // 1b. A destination that takes the connection and never answers HELLO (its vrdmad stopped
  //     with SIGSTOP: the kernel still accepts into the listener's backlog). The source waits
  //     for it on its event loop, not in it: while the migrate request is pending its status
  //     answers and the guest's traffic completes (60 more messages, the window is 16); the
  //     request is answered after 5 s with the reason, and the phase is idle again.
  {
    Vrdmad dst(g.dir, "silent", net.b, std::string("soft:") + kGuestIp, incoming_args("tcp:10.67.0.2:7824", "gB"));
    BOOST_REQUIRE_EQUAL(::kill(dst.child->pid(), SIGSTOP), 0);
    std::atomic<bool> replied{false};
    nlohmann::json r;
    const auto t0 = Clock::now();
    std::thread asker([&] {
      r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7824"}});
      replied = true;
    });
    const auto ms_since = [](Clock::time_point t) {
      return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    };
    double status_max_ms = 0;
    int probes = 0, connecting = 0;
    auto probe = [&] {
      const auto p0 = Clock::now();
      const auto st = g.here->status();
      status_max_ms = std::max(status_max_ms, ms_since(p0));
      ++probes;
      if (st["migration"]["phase"] == "connecting") ++connecting;
    };
    // The request is with vrdmad once it says so; the traffic is measured from there.
    while (connecting == 0 && !replied && ms_since(t0) < 3000) probe();
    BOOST_CHECK_MESSAGE(connecting > 0, "vrdmad never said it was connecting");
    const std::size_t sent0 = s.sent();
    auto next = Clock::now();
    s.run_until([&] {
      if (Clock::now() >= next) {
        probe();
        next = Clock::now() + 100ms;
      }
      return s.sent() >= sent0 + 60;
    }, 20s);
    const bool flowed_while_pending = !replied;
    const double flow_ms = ms_since(t0);
    while (!replied && ms_since(t0) < 15000) {
      probe();
      std::this_thread::sleep_for(100ms);
    }
    asker.join();
    const double waited = ms_since(t0);
    BOOST_TEST_MESSAGE("a destination that never answers: 60 messages in " << flow_ms << " ms, the answer after "
                       << waited << " ms: " << r.dump() << "; " << probes << " status requests (" << connecting
                       << " said connecting), the slowest " << status_max_ms << " ms");
    BOOST_CHECK_MESSAGE(flowed_while_pending, "the guest's traffic waited for the migrate request ("
                                                  << flow_ms << " ms for 60 messages)");
    BOOST_CHECK(r["ok"] == false);
    BOOST_CHECK_MESSAGE(r.value("error", "").find("did not answer HELLO within 5000 ms") != std::string::npos, r.dump());
    BOOST_CHECK_GE(waited, 4500.0);
    BOOST_CHECK_LT(status_max_ms, 1000.0);
    BOOST_CHECK_EQUAL(g.here->status()["migration"]["phase"], "idle");
    // The same again, cancelled while it connects: both requests are answered at once.
    replied = false;
    const auto t1 = Clock::now();
    std::thread asker2([&] {
      r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7824"}});
      replied = true;
    });
    connecting = 0;
    while (connecting == 0 && !replied && ms_since(t1) < 3000) probe();
    const auto c = g.here->control({{"cmd", "cancel"}});
    asker2.join();
    BOOST_TEST_MESSAGE("cancelled while connecting after " << ms_since(t1) << " ms: " << c.dump() << ", " << r.dump());
    BOOST_CHECK(c["ok"] == true);
    BOOST_CHECK(r["ok"] == false);
    BOOST_CHECK_MESSAGE(r.value("error", "").find("cancelled") != std::string::npos, r.dump());
    BOOST_CHECK_LT(ms_since(t1), 3000.0);
    BOOST_CHECK_EQUAL(g.here->status()["migration"]["phase"], "idle");
    ::kill(dst.child->pid(), SIGCONT);
  }

  // 2. The destination dies after accepting the guest, before the rings stop: the source says
  //    so, the frontend cannot reach the destination and runs the guest on at the source.
  {
    auto dst = std::make_unique<Vrdmad>(g.dir, "dies", net.b, std::string("soft:") + kGuestIp,
                                        incoming_args("tcp:10.67.0.2:7822", "gB"));
    auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7822"}});
    BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
    const std::string sock = dst->sock;
    dst->child->stop(SIGKILL);
    auto st = wait_phase(*g.here, "failed");
    BOOST_CHECK_MESSAGE(st["migration"]["message"].get<std::string>().find("keeps running here") != std::string::npos,
                        st.dump());
    auto m = pv::migrate(*g.dev, sock, 2000ms);
    BOOST_CHECK(!m.ok());
    if (!m.ok()) BOOST_TEST_MESSAGE("pv::migrate said: " << m.error().message);
  }
  s.run_until([&] { return s.sent() >= 350; });

  // 3. The destination rejects the state (its per-guest limits are lower than what the guest
  //    uses): the rings start there but are held, the probe gets no answer, the guest runs on
  //    at the source.
  {
    auto args = incoming_args("tcp:10.67.0.2:7823", "gB");
    args.insert(args.end(), {"--max-qp-wr", "8"});
    Vrdmad dst(g.dir, "rejects", net.b, std::string("soft:") + kGuestIp, args);
    auto r = g.here->control({{"cmd", "migrate"}, {"to", "tcp:10.67.0.2:7823"}});
    BOOST_REQUIRE_MESSAGE(r["ok"] == true, r.dump());
    auto m = pv::migrate(*g.dev, dst.sock, 3000ms);
    BOOST_CHECK(!m.ok());
    auto st = wait_phase(*g.here, "failed");
    BOOST_CHECK_MESSAGE(st["migration"]["message"].get<std::string>().find("rejected the device state") != std::string::npos,
                        st.dump());
    BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 1);
    BOOST_CHECK_EQUAL(dst.status()["objects"]["qp"].get<int>(), 0);
  }
  s.finish();
  BOOST_CHECK_EQUAL(g.here->status()["migration"]["phase"], "failed");  // and still serving the guest
}

// The way plain `virsh migrate` or QEMU's `migrate` moves the device, with no channel between
// the backends: nobody tells the source vrdmad anything; the frontend switches dirty logging
// on and stops the rings, so the source writes the device state into the guest's state area;
// the destination (--incoming guest) finds it there when the rings start on it.
BOOST_AUTO_TEST_CASE(guest_moves_with_its_state_in_guest_memory_a_to_b_and_back) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net(2);
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge (nftables?)");
  Guest g(net);
  const std::uint32_t qpn = g.a->qp->qp_num(), rkey = g.a->mr->rkey();
  Stream s(*g.a, *g.b, 900);
  BOOST_CHECK_GE(g.here->status()["state_area_bytes"].get<std::uint64_t>(), 64u << 10);  // the driver posted one

  const std::pair<std::string, std::string> moves[] = {{net.b, "gB"}, {net.a, "gA"}};
  int n = 0;
  for (const auto& [ns, ifname] : moves) {
    ++n;
    s.run_until([&] { return s.sent() >= s.msgs() * n / 4; });
    BOOST_TEST_CONTEXT("move " << n << " to " << ns) {
      auto dst = std::make_unique<Vrdmad>(g.dir, "mem" + std::to_string(n), ns, std::string("soft:") + kGuestIp,
                                          incoming_args("guest", ifname));
      BOOST_CHECK_EQUAL(dst->status()["migration"]["phase"], "incoming");
      const auto t0 = Clock::now();
      VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock, 10s, pv::StateVia::guest_memory));
      const double switch_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      auto src_st = wait_phase(*g.here, "migrated");
      auto dst_st = wait_phase(*dst, "running");
      BOOST_CHECK(wait_garps(*dst));
      BOOST_CHECK_EQUAL(dst_st["objects"]["qp"].get<int>(), 1);
      BOOST_CHECK_EQUAL(src_st["objects"]["qp"].get<int>(), 0);  // the source let go when the frontend left
      BOOST_TEST_MESSAGE("move " << n << " through guest memory: switched in " << switch_ms << " ms; state saved in "
                                 << src_st["migration"]["save_ms"] << " ms, loaded in " << dst_st["migration"]["load_ms"]
                                 << " ms");
      g.here->child->stop(SIGTERM);
      g.here = std::move(dst);
    }
  }
  // A destination serving another MAC refuses the state it finds and holds the rings: the
  // frontend's probe goes unanswered and the guest runs on here, nothing lost. The guest's QP is
  // frozen from the stop until the frontend is back at the source, so the probe must end well
  // inside the peer's ~0.5 s retry budget: with 2 % loss the peer often has a retransmission
  // due in that window (a 2 s probe failed the peer's work request now and then; 250 ms still
  // gave pauses of ~450 ms: the peer's retransmission timer and one more loss add to it).
  s.run_until([&] { return s.sent() >= s.msgs() * 3 / 4; });
  {
    Vrdmad dst(g.dir, "memwrongmac", net.b, std::string("soft:") + kGuestIp,
               {"--incoming", "guest", "--announce", "gB", "--mac", "52:54:00:99:99:99"});
    BOOST_CHECK(!pv::migrate(*g.dev, dst.sock, 100ms, pv::StateVia::guest_memory).ok());
    // The frontend has gone back to the source by now: the destination is waiting again, and
    // says why it refused (it saw the rings start while the probe waited; a slow machine may
    // log it a little later).
    nlohmann::json st;
    for (int i = 0; i < 500; ++i) {
      st = dst.status();
      if (st.is_object() && st["migration"]["message"].get<std::string>().find("the guest's MAC is") != std::string::npos)
        break;
      std::this_thread::sleep_for(10ms);
    }
    BOOST_REQUIRE_MESSAGE(st.is_object(), "the wrong-MAC destination does not answer its control socket; its log:\n"
                                              << read_file(dst.log));
    BOOST_CHECK_MESSAGE(st["migration"]["message"].get<std::string>().find("the guest's MAC is") != std::string::npos,
                        st.dump());
    BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 0);
    BOOST_CHECK_EQUAL(st["migration"]["garps"].get<int>(), 0);  // it never claimed the guest's address
  }
  s.finish();
  BOOST_TEST_MESSAGE("longest pause between completions: " << s.longest_gap_ms() << " ms; the switch dropped "
                                                              << net.dropped() << " RoCE packets");
  BOOST_CHECK_EQUAL(g.a->qp->qp_num(), qpn);
  BOOST_CHECK_EQUAL(g.a->mr->rkey(), rkey);
  BOOST_CHECK_EQUAL(g.here->status()["objects"]["qp"].get<int>(), 1);
}

// A supervised backend (--supervise, as the libvirt hook starts it) that dies is started again
// at once with --incoming guest. Here the destination is killed after it was started for the
// guest and before the switch: its successor takes the guest, state from guest memory, peer
// unmodified. Before that, a move that fails leaves the source running and withdraws the state
// it wrote into guest memory at the stop, so that a backend started later on this guest never
// takes that stale state for the guest's objects.
BOOST_AUTO_TEST_CASE(a_supervised_destination_killed_before_the_switch_is_started_again_and_takes_the_guest) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  Guest g(net);
  const std::uint32_t qpn = g.a->qp->qp_num(), rkey = g.a->mr->rkey();
  Stream s(*g.a, *g.b, 600);
  s.run_until([&] { return s.sent() >= 150; });

  // 1. A failed move through guest memory (the destination serves another MAC): the source runs
  //    on and withdraws the state it wrote at the stop.
  {
    Vrdmad dst(g.dir, "supwrongmac", net.b, std::string("soft:") + kGuestIp,
               {"--incoming", "guest", "--announce", "gB", "--mac", "52:54:00:99:99:99"});
    BOOST_CHECK(!pv::migrate(*g.dev, dst.sock, 100ms, pv::StateVia::guest_memory).ok());
  }
  const std::string src_log = read_file(g.here->log);
  BOOST_CHECK_EQUAL(count_in(src_log, "written into guest memory"), 1u);
  BOOST_CHECK_MESSAGE(count_in(src_log, "the device state written at the stop is withdrawn") == 1, src_log);
  s.run_until([&] { return s.sent() >= 300; });

  // 2. The destination, supervised, loses its backend before the switch.
  auto args = incoming_args("guest", "gB");
  args.emplace_back("--supervise");
  auto dst = std::make_unique<Vrdmad>(g.dir, "supervised", net.b, std::string("soft:") + kGuestIp, args);
  const pid_t first = supervised_backend(dst->child->pid());
  BOOST_REQUIRE_MESSAGE(first != 0, "vrdmad --supervise runs no backend; log:\n" << read_file(dst->log));
  const pid_t second = kill_and_wait_for_restart(*dst);
  BOOST_REQUIRE_MESSAGE(second != 0, "the supervisor did not start the backend again; log:\n" << read_file(dst->log));
  BOOST_CHECK(read_file(dst->log).find("the backend " + std::to_string(first) +
                                       " was killed by signal 9 (SIGKILL); starting it again (restart 1 of at most 5") !=
              std::string::npos);
  BOOST_CHECK_EQUAL(dst->status()["migration"]["phase"], "incoming");
  const std::string cmdline = read_file("/proc/" + std::to_string(second) + "/cmdline");
  BOOST_CHECK_MESSAGE(cmdline.find(std::string("--restarted\0", 12)) != std::string::npos,
                      "the restarted backend was not told it replaces one (--restarted)");

  // 3. The guest moves to the new backend and carries on there.
  VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock, 10s, pv::StateVia::guest_memory));
  auto dst_st = wait_phase(*dst, "running");
  BOOST_CHECK_EQUAL(dst_st["objects"]["qp"].get<int>(), 1);
  wait_phase(*g.here, "migrated");
  g.here->child->stop(SIGTERM);
  g.here = std::move(dst);
  s.finish();
  BOOST_CHECK_EQUAL(g.a->qp->qp_num(), qpn);
  BOOST_CHECK_EQUAL(g.a->mr->rkey(), rkey);
  BOOST_TEST_MESSAGE("longest pause between completions: " << s.longest_gap_ms() << " ms");
  // It took its state from guest memory: nothing was lost, and it said nothing of the kind.
  BOOST_CHECK(read_file(g.here->log).find("replaces one that died") == std::string::npos);
}

// A frontend that comes back to a restarted backend (QEMU's reconnect) brings the rings but no
// state: the objects died with the old backend. Here the rings move from a live backend to one
// started as a supervisor starts a successor (--incoming guest --restarted) with no state in the
// guest's memory (the rings stop without dirty logging, as at a crash nothing is saved). The
// driver, which has objects, hears it at once: polls and commands fail with the reason.
BOOST_AUTO_TEST_CASE(a_driver_with_objects_hears_that_a_restarted_backend_has_none) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  Guest g(net);
  auto args = incoming_args("guest", "gB");
  args.emplace_back("--restarted");
  auto dst = std::make_unique<Vrdmad>(g.dir, "successor", net.b, std::string("soft:") + kGuestIp, args);
  VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock, 10s, pv::StateVia::backends));
  auto st = wait_phase(*dst, "running");
  const std::string msg = st["migration"]["message"].get<std::string>();
  BOOST_CHECK_MESSAGE(msg.find("this vrdmad replaces one that died") != std::string::npos, msg);
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 0);
  const auto polled = poll_until_error(*g.a->cq);
  BOOST_REQUIRE_MESSAGE(!polled.ok(), "the guest's CQ never reported the lost objects; successor's log:\n"
                                          << read_file(dst->log));
  BOOST_CHECK_MESSAGE(polled.error().message.find("backend restarted") != std::string::npos &&
                          polled.error().message.find("close the device and open it again") != std::string::npos,
                      polled.error().message);
  BOOST_CHECK(!g.dev->alloc_pd().ok());
  g.here->child->stop(SIGTERM);
  g.here = std::move(dst);
}

// The same news to a driver that has no objects yet is no loss: it carries on and the device
// serves it.
BOOST_AUTO_TEST_CASE(a_driver_without_objects_carries_on_with_a_restarted_backend) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  TempDir dir;
  auto args = incoming_args("guest", "gA");
  args.emplace_back("--restarted");
  Vrdmad d(dir, "fresh", net.a, std::string("soft:") + kGuestIp, args);
  auto dev = open_device(d.device() + "?ram_mib=64");
  VRDMA_REQUIRE_OK(dev);
  auto st = wait_phase(d, "running");
  BOOST_CHECK(read_file(d.log).find("DEVICE_FATAL") != std::string::npos);
  auto peer = soft_engine_in(net.p, kPeerIp);
  PairOptions o;
  o.buf_bytes = 2u << 20;
  auto a = make_endpoint(*dev, o);
  VRDMA_REQUIRE_OK(a);
  auto b = make_endpoint(peer, o);
  VRDMA_REQUIRE_OK(b);
  VRDMA_REQUIRE_OK(connect(*a, *b, o));
  Stream s(*a, *b, 50);
  s.finish();
}

// A backend that keeps dying is started again at most 5 times a minute; then the supervisor
// gives up, says so, and ends with status 1 (so that the hook and the operator see it).
BOOST_AUTO_TEST_CASE(a_supervisor_gives_up_on_the_sixth_death_within_a_minute) {
  TempDir dir;
  Vrdmad d(dir, "crashy", "", "soft:127.0.0.1", {"--supervise"});
  for (int i = 1; i <= 5; ++i) BOOST_REQUIRE_MESSAGE(kill_and_wait_for_restart(d) != 0, "restart " << i << " did not come; log:\n"
                                                                                                 << read_file(d.log));
  const std::string log = read_file(d.log);
  BOOST_CHECK_EQUAL(count_in(log, "starting it again"), 5u);
  BOOST_CHECK_EQUAL(count_in(log, "with --incoming guest"), 5u);
  // (SIGUSR1, not SIGSEGV: ASan takes a SEGV over and ends the process with SIGABRT instead)
  ::kill(supervised_backend(d.child->pid()), SIGUSR1);
  const int st = d.child->wait(10000);
  BOOST_CHECK_MESSAGE(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the supervisor ended with wait status " << st);
  BOOST_CHECK_MESSAGE(read_file(d.log).find("was killed by signal 10 (SIGUSR1) for the 6th time within a minute; not "
                                            "starting it again") != std::string::npos,
                      read_file(d.log));
}

// SIGTERM (or SIGINT) to the supervisor goes to the backend, which ends as it always does; the
// supervisor ends with its status and starts nothing.
BOOST_AUTO_TEST_CASE(sigterm_to_a_supervisor_ends_its_backend_and_it) {
  TempDir dir;
  Vrdmad d(dir, "term", "", "soft:127.0.0.1", {"--supervise"});
  const pid_t backend = supervised_backend(d.child->pid());
  BOOST_REQUIRE(backend != 0);
  const int st = d.child->stop(SIGTERM);
  BOOST_CHECK_MESSAGE(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the supervisor ended with wait status " << st);
  BOOST_CHECK(::kill(backend, 0) != 0);
  const std::string log = read_file(d.log);
  BOOST_CHECK_MESSAGE(log.find("vrdmad: exiting") != std::string::npos, log);
  BOOST_CHECK_EQUAL(count_in(log, "starting it again"), 0u);
}

// A state the source cannot save (here a REG_MR still waiting in a send queue, behind a fenced
// READ the peer never answers: it names memory of this host; a NIC's SRQs the same) must not
// leave the guest waiting on objects that are gone: the source writes why into the state area,
// the destination runs the guest with no objects, says so, and tells the driver (DEVICE_FATAL),
// whose CQ polls and commands then fail with the reason.
BOOST_AUTO_TEST_CASE(a_state_the_source_cannot_save_arrives_as_a_device_fatal_with_the_reason) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  Guest g(net);
  PairOptions slow = g.o;
  slow.timeout = 20;  // ~4 s before the READ is sent again: the move happens first
  auto ea = make_endpoint(g.dev, slow);
  auto eb = make_endpoint(g.peer, slow);
  VRDMA_REQUIRE_OK(ea);
  VRDMA_REQUIRE_OK(eb);
  VRDMA_REQUIRE_OK(connect(*ea, *eb, slow));
  QpAttr err;
  err.qp_state = QpState::err;
  VRDMA_REQUIRE_OK(eb->qp->modify(err, QpAttrMask::state));  // it drops every request now
  Sge local{reinterpret_cast<std::uint64_t>(ea->buf.data()), 100, ea->mr->lkey()};
  SendWr rd;
  rd.wr_id = 1;
  rd.opcode = WrOpcode::rdma_read;
  rd.flags = SendFlags::signaled;
  rd.sg_list = std::span(&local, 1);
  rd.rdma.remote_addr = eb->mr->addr();
  rd.rdma.rkey = eb->mr->rkey();
  auto fast = ea->pd->alloc_mr(4);
  VRDMA_REQUIRE_OK(fast);
  SendWr reg;
  reg.wr_id = 2;
  reg.opcode = WrOpcode::reg_mr;
  reg.flags = SendFlags::signaled | SendFlags::fence;
  reg.reg.mr = fast->get();
  reg.reg.addr = ea->buf.data() + 4096;
  reg.reg.iova = 0x7000000000;
  reg.reg.length = 4096;
  reg.reg.access = Access::local_write | Access::remote_read;
  reg.reg.key = ((*fast)->lkey() & ~0xffu) | 0x11;
  const SendWr wrs[] = {rd, reg};
  VRDMA_REQUIRE_OK(ea->qp->post_send(std::span(wrs)));
  std::this_thread::sleep_for(100ms);  // the device hands both to the engine
  auto dst = std::make_unique<Vrdmad>(g.dir, "lost", net.b, std::string("soft:") + kGuestIp,
                                      incoming_args("guest", "gB"));
  VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock, 10s, pv::StateVia::guest_memory));
  auto st = wait_phase(*dst, "running");
  const std::string msg = st["migration"]["message"].get<std::string>();
  BOOST_CHECK_MESSAGE(msg.find("the guest's RDMA objects did not come with it (the source could not save the device "
                               "state: ") != std::string::npos && msg.find("a REG_MR waits in the send queue") != std::string::npos,
                      msg);
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 0);
  BOOST_CHECK(read_file(g.here->log).find("the device state could not go into guest memory") != std::string::npos);
  // The driver hears it: an empty poll fails with the reason, and so do commands.
  const auto polled = poll_until_error(*g.a->cq);
  BOOST_REQUIRE_MESSAGE(!polled.ok(), "the guest's CQ never reported the lost device; destination log:\n"
                                          << read_file(dst->log));
  BOOST_CHECK_MESSAGE(polled.error().message.find("lost every RDMA object in a migration") != std::string::npos,
                      polled.error().message);
  auto pd = g.dev->alloc_pd();
  BOOST_CHECK(!pd.ok());
  if (!pd.ok()) BOOST_CHECK(pd.error().message.find("close the device and open it again") != std::string::npos);
  // The state area no longer holds the marker: a backend started again finds nothing.
  BOOST_CHECK(read_file(dst->log).find("DEVICE_FATAL") != std::string::npos);
  g.here->child->stop(SIGTERM);
  g.here = std::move(dst);
}

namespace {
// One signaled work request on `e`'s QP, waited for: its completion.
WorkCompletion one_wr(Endpoint& e, const SendWr& wr) {
  VRDMA_REQUIRE_OK(e.qp->post_send(std::span(&wr, 1)));
  const auto wcs = wait_cq(*e.cq, 1, 10s);
  BOOST_REQUIRE_EQUAL(wcs.size(), 1u);
  return wcs[0];
}

// The peer READs `n` bytes at `iova` through `rkey` into the start of its buffer (zeroed first).
WcStatus peer_reads(Guest& g, std::uint64_t iova, std::uint32_t rkey, std::uint32_t n) {
  std::memset(g.b->buf.data(), 0, n);
  Sge s{reinterpret_cast<std::uint64_t>(g.b->buf.data()), n, g.b->mr->lkey()};
  SendWr rd;
  rd.wr_id = 7;
  rd.opcode = WrOpcode::rdma_read;
  rd.flags = SendFlags::signaled;
  rd.sg_list = std::span(&s, 1);
  rd.rdma.remote_addr = iova;
  rd.rdma.rkey = rkey;
  return one_wr(*g.b, rd).status;
}

// REG_MR of `mr` over n bytes 1 KiB into `at` of the guest's buffer, named from `iova`, key `key`.
WcStatus fast_register(Guest& g, MemoryRegion& mr, std::size_t at, std::uint32_t n, std::uint64_t iova,
                       std::uint32_t key) {
  SendWr reg;
  reg.wr_id = 9;
  reg.opcode = WrOpcode::reg_mr;
  reg.flags = SendFlags::signaled;
  reg.reg.mr = &mr;
  reg.reg.addr = g.a->buf.data() + at + 1024;
  reg.reg.iova = iova;
  reg.reg.length = n;
  reg.reg.access = Access::local_write | Access::remote_read;
  reg.reg.key = key;
  return one_wr(*g.a, reg).status;
}
}  // namespace

// Fast-registration regions move with the guest (state version 4): one registered over the
// guest's buffer keeps its key, name and pages at the destination (the peer READs the same
// bytes through it there), one never registered moves invalid and takes a REG_MR there, and
// the moved one still ends at a LOCAL_INV.
BOOST_AUTO_TEST_CASE(fast_registration_regions_move_with_the_guest) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  Guest g(net);
  auto fast = g.a->pd->alloc_mr(8);
  auto idle = g.a->pd->alloc_mr(4);
  VRDMA_REQUIRE_OK(fast);
  VRDMA_REQUIRE_OK(idle);
  const std::uint32_t n = 20000;  // 5 pages from 1 KiB into the first
  const std::uint64_t iova = 0x6000000000 + 1024;
  const std::uint32_t key = ((*fast)->lkey() & ~0xffu) | 0x42;
  fill_pattern(g.a->buf.data() + (256 << 10) + 1024, n, 77);
  BOOST_REQUIRE_EQUAL(fast_register(g, **fast, 256 << 10, n, iova, key), WcStatus::success);
  BOOST_REQUIRE_EQUAL(peer_reads(g, iova, key, n), WcStatus::success);
  BOOST_REQUIRE(check_pattern(g.b->buf.data(), n, 77));

  auto dst = std::make_unique<Vrdmad>(g.dir, "fastmr", net.b, std::string("soft:") + kGuestIp,
                                      incoming_args("guest", "gB"));
  VRDMA_REQUIRE_OK(pv::migrate(*g.dev, dst->sock, 10s, pv::StateVia::guest_memory));
  auto st = wait_phase(*dst, "running");
  BOOST_CHECK_MESSAGE(st["migration"]["message"].get<std::string>() == "the guest runs here", st.dump());
  BOOST_CHECK_EQUAL(st["objects"]["mr"].get<int>(), 3);  // the endpoint's and the two fast ones
  BOOST_CHECK(wait_garps(*dst));
  g.here->child->stop(SIGTERM);
  g.here = std::move(dst);

  BOOST_CHECK_EQUAL(peer_reads(g, iova, key, n), WcStatus::success);
  BOOST_CHECK(check_pattern(g.b->buf.data(), n, 77));
  const std::uint32_t key2 = ((*idle)->lkey() & ~0xffu) | 0x07;
  const std::uint64_t iova2 = 0x6100000000 + 1024;
  fill_pattern(g.a->buf.data() + (512 << 10) + 1024, 8000, 78);
  BOOST_CHECK_EQUAL(fast_register(g, **idle, 512 << 10, 8000, iova2, key2), WcStatus::success);
  BOOST_CHECK_EQUAL(peer_reads(g, iova2, key2, 8000), WcStatus::success);
  BOOST_CHECK(check_pattern(g.b->buf.data(), 8000, 78));
  SendWr inv;
  inv.wr_id = 11;
  inv.opcode = WrOpcode::local_inv;
  inv.flags = SendFlags::signaled;
  inv.invalidate_rkey = key;
  BOOST_CHECK_EQUAL(one_wr(*g.a, inv).status, WcStatus::success);
  // A REG_MR wants an invalid region: the LOCAL_INV of the moved one took.
  BOOST_CHECK_EQUAL(fast_register(g, **fast, 256 << 10, n, iova, key + 1), WcStatus::success);
  BOOST_CHECK_EQUAL(peer_reads(g, iova, key + 1, n), WcStatus::success);
}

// SRQs move with the guest (state version 6): a QP on an SRQ that served 3 of its 8 receives
// before the move fills the other 5 after it, in the order posted, with their wr_ids and bytes;
// the SRQ's ring goes on where it was (2 receives posted there serve 2 more SENDs).
BOOST_AUTO_TEST_CASE(srqs_move_with_the_guest) {
  BOOST_REQUIRE_MESSAGE(can_make_netns(), "needs root for network namespaces");
  Fabric net;
  BOOST_REQUIRE_MESSAGE(net.ok, "cannot build the namespaces and the bridge");
  Guest g(net);
  auto srq = g.a->pd->create_srq(16, 1);
  VRDMA_REQUIRE_OK(srq);
  QpInitAttr ia;
  ia.send_cq = g.a->cq.get();
  ia.recv_cq = g.a->cq.get();
  ia.srq = srq->get();
  ia.cap.max_send_wr = 16;
  auto on_srq = g.a->pd->create_qp(ia);
  VRDMA_REQUIRE_OK(on_srq);
  QpInitAttr pia;
  pia.send_cq = g.b->cq.get();
  pia.recv_cq = g.b->cq.get();
  pia.cap.max_send_wr = 16;
  pia.cap.max_recv_wr = 16;
  auto sender = g.b->pd->create_qp(pia);
  VRDMA_REQUIRE_OK(sender);
  Endpoint a = *g.a, b = *g.b;
  a.qp = *on_srq;
  b.qp = *sender;
  VRDMA_REQUIRE_OK(connect(a, b, g.o));
  constexpr std::uint32_t kLen = 3000;
  const std::size_t base = 1u << 20;  // the receives' buffers: 4 KiB each from 1 MiB into the guest's
  auto post = [&](int i) {
    Sge r{reinterpret_cast<std::uint64_t>(g.a->buf.data() + base + 4096 * static_cast<std::size_t>(i)), 4096,
          g.a->mr->lkey()};
    RecvWr rw{200 + static_cast<std::uint64_t>(i), std::span<const Sge>(&r, 1)};
    VRDMA_REQUIRE_OK((*srq)->post_recv(std::span<const RecvWr>(&rw, 1)));
  };
  // SEND i from the peer must land in receive i.
  auto send_and_check = [&](int i) {
    fill_pattern(g.b->buf.data() + 4096 * static_cast<std::size_t>(i), kLen, 300 + static_cast<std::uint64_t>(i));
    Sge s{reinterpret_cast<std::uint64_t>(g.b->buf.data() + 4096 * static_cast<std::size_t>(i)), kLen, g.b->mr->lkey()};
    SendWr w;
    w.wr_id = static_cast<std::uint64_t>(i);
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span(&s, 1);
    VRDMA_REQUIRE_OK(b.qp->post_send(std::span(&w, 1)));
    const auto sent = wait_cq(*g.b->cq, 1, 10s);
    BOOST_REQUIRE_EQUAL(sent.size(), 1u);
    BOOST_CHECK_EQUAL(sent[0].status, WcStatus::success);
    const auto got = wait_cq(*g.a->cq, 1, 10s);
    BOOST_REQUIRE_EQUAL(got.size(), 1u);
    BOOST_CHECK_EQUAL(got[0].status, WcStatus::success);
    BOOST_CHECK_EQUAL(got[0].wr_id, 200 + static_cast<std::uint64_t>(i));
    BOOST_CHECK_EQUAL(got[0].byte_len, kLen);
    BOOST_CHECK_EQUAL(got[0].qp_num, a.qp->qp_num());
    BOOST_CHECK_MESSAGE(check_pattern(g.a->buf.data() + base + 4096 * static_cast<std::size_t>(i), kLen,
                                      300 + static_cast<std::uint64_t>(i)),
                        "receive " << i << " does not hold SEND " << i << "'s bytes");
  };
  for (int i = 0; i < 8; ++i) post(i);
  for (int i = 0; i < 3; ++i) send_and_check(i);

  auto dst = std::make_unique<Vrdmad>(g.dir, "srq", net.b, std::string("soft:") + kGuestIp,
                                      incoming_args("guest", "gB"));
  const auto moved = pv::migrate(*g.dev, dst->sock, 10s, pv::StateVia::guest_memory);
  BOOST_REQUIRE_MESSAGE(moved.ok(), moved.error().message << "\nsource log:\n" << read_file(g.here->log)
                                                          << "\ndestination log:\n" << read_file(dst->log));
  auto st = wait_phase(*dst, "running");
  BOOST_CHECK_MESSAGE(st["migration"]["message"].get<std::string>() == "the guest runs here", st.dump());
  BOOST_CHECK_EQUAL(st["objects"]["srq"].get<int>(), 1);
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 2);
  BOOST_CHECK(wait_garps(*dst));
  g.here->child->stop(SIGTERM);
  g.here = std::move(dst);

  for (int i = 3; i < 8; ++i) send_and_check(i);
  post(8);
  post(9);
  for (int i = 8; i < 10; ++i) send_and_check(i);
}
