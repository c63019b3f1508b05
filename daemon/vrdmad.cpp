// vrdmad: the virtio RDMA device backend, one process per guest device.
//
//   vrdmad --socket PATH --engine soft:<ip>|verbs:<ibdev> [--control PATH] [--mac MAC]
//          [--incoming tcp:IP:PORT] [--announce IFNAME] [--notices IP[,IP]] [limits...]
//
// Serves vhost-user on PATH (to QEMU, or to a libpvverbs process acting as the frontend) and,
// with --control, a JSON control socket: each connection sends one request line and gets one
// JSON line back:
//   {"cmd":"status"} / {"cmd":"stats"}           objects, counters and the migration phase
//   {"cmd":"migrate","to":"tcp:IP:PORT"}         start a live migration to a destination vrdmad
//       [,"prestate":false]                      (without building the objects there ahead)
//   {"cmd":"cancel"}                             give up an armed migration
// --incoming makes this vrdmad a migration destination (docs/migration.md). --notices IP[,IP]
// takes part in peer notices on a NIC (migration/peer_notice.hpp). SIGTERM/SIGINT end it.
// --supervise keeps a small parent that starts the backend again when it dies of anything but
// SIGTERM/SIGINT (docs/migration.md "A backend that dies").
#include <grp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "vrdma/common/cli.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/migration/peer_notice.hpp"
#include "vrdma/migration/switchover.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/vhost/backend.hpp"
#include "vrdma/vhost/channel.hpp"
#include "vrdma/device/rdma_device.hpp"

#include "control_socket.hpp"
#include "stats.hpp"
#include "privileges.hpp"
#include "supervise.hpp"

using namespace vrdma;
using vrdmad::ControlConnections;
using vrdmad::listen_unix;
using vrdmad::migration_json;
using vrdmad::stats_json;

namespace {

bool parse_mac(const std::string& s, std::uint8_t (&mac)[6]) {
  unsigned v[6];
  char tail;
  if (std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &tail) != 6) return false;
  for (int i = 0; i < 6; ++i) {
    if (v[i] > 0xff) return false;
    mac[i] = static_cast<std::uint8_t>(v[i]);
  }
  return true;
}

// The vhost-user socket for QEMU's group only: root:GROUP, mode 0660 (connect(2) on a UNIX
// socket needs write permission on its file). GROUP is a name or +GID, as in libvirt's qemu.conf.
Result<gid_t> socket_group_id(const std::string& name) {
  if (name.size() > 1 && name[0] == '+') {
    char* end = nullptr;
    const unsigned long v = std::strtoul(name.c_str() + 1, &end, 10);
    if (*end != '\0' || v > 0x7fffffffUL)
      return make_error(Errc::invalid_argument, "--socket-group " + name + " is not a group name or +GID");
    return static_cast<gid_t>(v);
  }
  std::vector<char> buf(16384);
  struct group gr {};
  struct group* found = nullptr;
  if (::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return make_error(Errc::not_found, "--socket-group: there is no group " + name +
                                           " on this host (libvirt's qemu.conf names the group QEMU runs as)");
  return gr.gr_gid;
}

Status give_socket_to_group(const std::string& path, gid_t gid) {
  if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0)
    return errno_error(errno, "giving the socket " + path + " to group " + std::to_string(gid));
  if (::chmod(path.c_str(), 0660) != 0) return errno_error(errno, "making the socket " + path + " mode 0660");
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--supervise") == 0) return vrdmad::supervise(argc, argv);
  CLI::App app{"vrdmad: virtio RDMA device backend (vhost-user), one process per guest device", "vrdmad"};
  vrdma::cli::prepare(app);
  std::string sock, engine_name, control, incoming, announce, mac = "52:54:00:00:00:01";
  device::RdmaDeviceOptions opts;
  migration::MigrationOptions mopts;  // filled below; its device options from the command line
  auto& lim = opts.limits;
  app.add_option("--socket", sock, "vhost-user socket to serve")->required();
  app.add_option("--engine", engine_name, "RDMA engine: soft:<ip|ifname>[?opts] or verbs:<ibdev|pci>")->required();
  app.add_option("--control", control, "JSON control socket (status, stats, migrate, cancel)");
  std::string socket_group;
  app.add_option("--socket-group", socket_group,
                 "the group QEMU runs as (libvirt's qemu.conf `group`, e.g. libvirt-qemu, or +GID): the vhost-user "
                 "socket becomes this group's, mode 0660, so QEMU can connect and no other user can");
  app.add_option("--mac", mac, "the guest device's MAC address")->capture_default_str();
  app.add_option("--incoming", incoming, "be a migration destination: receive the guest's device state from a source vrdmad on tcp:IP:PORT, or with \"guest\" only from the guest's own memory (its state area: the way under plain virsh migrate or QEMU migrate)");
  app.add_option("--announce", announce,
                 "interface holding the guest's address on this host (soft engine): kept silent (NOARP) while the "
                 "guest is elsewhere, announced with gratuitous ARPs when it arrives");
  std::string domain;
  app.add_option("--domain", domain, "the libvirt domain this backend serves (the hook passes it): named in the status "
                                     "and in `vrdmactl list`");
  bool supervised = false;  // handled before parsing (supervise()); listed for --help
  app.add_flag("--supervise", supervised,
               "keep a parent process that starts the backend again (with --incoming guest) when it crashes or is "
               "killed, at most 5 times a minute");
  bool keep_privileges = false;
  app.add_flag("--keep-privileges", keep_privileges,
               "keep every capability it starts with; by default, before it opens its engine, it keeps only "
               "CAP_CHOWN, CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK and can gain no others (no new privileges)");
  std::string migration_engine;
  app.add_option("--migration-engine", migration_engine,
                 "RDMA engine on the migration network (verbs:<ibdev> of the migration VF, or soft:<host address>): "
                 "when the other vrdmad has one too, the device state goes over it as an RDMA WRITE instead of TCP");
  bool restarted = false;
  app.add_flag("--restarted", restarted,
               "this backend replaces one that died (--supervise passes it): with no device state in the guest's "
               "memory, the guest's driver is told its RDMA objects are gone (DEVICE_FATAL)");
  unsigned poll_us = 0;
  app.add_option("--poll-us", poll_us,
                 "keep polling the guest's doorbells and the engine's completions for this many microseconds after "
                 "the last work instead of sleeping until the next kick or completion event (lower latency for a "
                 "core's worth of polling while traffic flows; 0: sleep at once)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000000u));
  std::string notices_ip;
  app.add_option("--notices", notices_ip,
                 "on a NIC, tell the vrdma backends of the guest's QPs' peers where a QP went when the guest moves, and "
                 "take their notices: listen for them on this address (the guest's RDMA address on this host, IPv4 or "
                 "IPv6; a comma-separated list for a guest with both)");
  app.add_option("--notice-port", mopts.device.notice_port, "TCP port of the peer notices")->capture_default_str();
  app.add_option("--notice-hold-ms", mopts.device.hold_timeout_ms,
                 "how long a QP paused for a moving peer waits to be re-pointed before its sends go on")
      ->capture_default_str()
      ->check(CLI::Range(100u, 600000u));
  app.add_option("--max-qp", lim.max_qp, "QPs per guest")->capture_default_str();
  app.add_option("--max-cq", lim.max_cq, "CQs per guest")->capture_default_str();
  app.add_option("--max-mr", lim.max_mr, "MRs per guest")->capture_default_str();
  app.add_option("--max-pd", lim.max_pd, "PDs per guest")->capture_default_str();
  app.add_option("--max-registered-bytes", lim.max_registered_bytes, "registered memory per guest, in bytes")
      ->capture_default_str();
  app.add_option("--max-qp-wr", lim.max_qp_wr, "work requests per queue")->capture_default_str();
  if (auto rc = vrdma::cli::parse(app, argc, argv)) return *rc;
  // SIGTERM/SIGINT end the event loop through a signalfd. Blocked before any thread exists (the
  // engine's own), so that no thread takes them with their default action instead.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (!parse_mac(mac, opts.mac)) {
    log::error("vrdmad: --mac {} is not a MAC address like 52:54:00:12:34:56", mac);
    return 2;
  }

  // One fd per CQ (its engine event fd): allow as many as the hard limit permits.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
  }

  std::optional<gid_t> socket_gid;
  if (!socket_group.empty()) {
    auto g = socket_group_id(socket_group);
    if (!g) {
      log::error("vrdmad: {}", g.error().message);
      return 1;
    }
    socket_gid = *g;
  }
  // A live backend's socket is refused before anything else is opened (channel.hpp).
  if (auto st = vhost::claim_socket_path(sock); !st.ok()) {
    log::error("vrdmad: cannot serve {}: {}", sock, st.error().message);
    return 1;
  }
  // Keep only what serving needs, before any RDMA device is open: the kernel refuses a uverbs
  // or rdma_cm file's write() commands (posting on rxe, for one) from credentials other than
  // those that opened it (ib_safe_file_access: "changed security contexts after opening").
  if (!keep_privileges) {
    auto held = vrdmad::drop_privileges();
    if (!held) {
      log::error("vrdmad: {} (--keep-privileges runs without dropping them)", held.error().message);
      return 1;
    }
    log::info("vrdmad: {}", *held);
  }
  auto engine = nicdrv::open_device(engine_name);
  if (!engine) {
    log::error("vrdmad: cannot open engine {}: {}", engine_name, engine.error().message);
    return 1;
  }
  auto loop = vhost::EventLoop::create();
  if (!loop) {
    log::error("vrdmad: {}", loop.error().message);
    return 1;
  }
  mopts.device.notices = !notices_ip.empty();
  device::RdmaDevice dev(*engine, *loop, opts);
  mopts.engine_name = engine_name;
  mopts.mac = mac;
  mopts.announce_if = announce;
  mopts.self = sock;
  mopts.restarted = restarted;
  if (!migration_engine.empty()) {
    auto me = nicdrv::open_device(migration_engine);
    if (!me) {
      log::error("vrdmad: cannot open the migration engine {}: {}", migration_engine, me.error().message);
      return 1;
    }
    mopts.migration_engine = *me;
    log::info("vrdmad: the device state of a migration goes over RDMA on {} when the other vrdmad has an engine too",
              migration_engine);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) mopts.self = std::string(host) + ":" + sock;
  migration::MigratingDevice mig(dev, *loop, mopts);
  if (!incoming.empty()) {
    if (auto s = mig.listen_incoming(incoming); !s.ok()) {
      log::error("vrdmad: cannot wait for an incoming migration on {}: {}", incoming, s.error().message);
      return 1;
    }
  }
  auto srv = vhost::BackendServer::listen(sock, mig, *loop);
  if (!srv) {
    log::error("vrdmad: cannot serve {}: {}", sock, srv.error().message);
    return 1;
  }
  if (socket_gid) {
    if (auto st = give_socket_to_group(sock, *socket_gid); !st.ok()) {
      log::error("vrdmad: {}", st.error().message);
      return 1;
    }
  }

  UniqueFd sfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  (void)loop->add(sfd.get(), EPOLLIN, [&](std::uint32_t) { loop->stop(); });

  // Peer notices (--notices): the listener follows the guest. It is held while the guest runs on
  // this backend (or no migration is under way) and given up once the guest has left (migrated,
  // or its state went into its memory for a move); a destination takes it when the guest runs
  // there. On one host the source and the destination of a move share the guest's address, and
  // the port goes with the guest; across hosts each takes its own.
  UniqueFd notice_timer;
  struct NoticeListener {
    migration::notice::Address addr;
    std::unique_ptr<migration::notice::Server> server;
    bool busy_said = false;
  };
  std::vector<NoticeListener> notice_listeners;
  for (std::size_t at = 0; !notices_ip.empty() && at != std::string::npos;) {
    const auto comma = notices_ip.find(',', at);
    const auto text = notices_ip.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? comma : comma + 1;
    auto a = migration::notice::parse_address(text);
    if (!a || !migration::notice::notice_address(*a)) {
      log::error("vrdmad: --notices: {} is not an IPv4 or global IPv6 address (the guest's RDMA address on this host)",
                 text);
      return 2;
    }
    notice_listeners.push_back({*a, std::make_unique<migration::notice::Server>(
                                        *loop, [&mig](const migration::notice::Message& m, const migration::notice::Address& from) {
                                          return mig.device_state().peer_notice(m, from);
                                        })});
  }
  auto notices_listening = [&] {
    bool all = !notice_listeners.empty();
    for (const auto& l : notice_listeners) all = all && l.server->listening();
    return all;
  };
  auto follow_guest = [&]() -> Status {
    using migration::Phase;
    const auto phase = mig.status().phase;
    const bool here = phase == Phase::idle || phase == Phase::running || phase == Phase::failed ||
                      phase == Phase::armed || phase == Phase::state_sent;
    for (auto& l : notice_listeners) {
      const auto where = migration::notice::to_string(l.addr);
      if (!here && l.server->listening()) {
        l.server->close();
        log::info("vrdmad: the guest left; this vrdmad takes no more peer notices on {} port {}", where,
                  mopts.device.notice_port);
      } else if (here && !l.server->listening()) {
        auto ok = l.server->listen(l.addr, mopts.device.notice_port);
        if (!ok) return std::move(ok).error();
        if (!*ok) {
          if (!l.busy_said)
            log::warn("vrdmad: another process takes peer notices on {} port {} (another backend of this guest on this "
                      "host?): this vrdmad takes them once that one lets go",
                      where, mopts.device.notice_port);
          l.busy_said = true;
          continue;
        }
        l.busy_said = false;
        log::info("vrdmad: taking peer notices on {} port {}", where, mopts.device.notice_port);
      }
    }
    return {};
  };
  if (!notices_ip.empty()) {
    if (auto st = follow_guest(); !st.ok()) {
      log::error("vrdmad: {}", st.error().message);
      return 1;
    }
    notice_timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    // Every 20 ms: on one host, the gap in which neither backend of a moving guest listens is
    // at most about two periods (a timerfd read and a status copy each: negligible CPU).
    itimerspec every{{0, 20'000'000}, {0, 20'000'000}};
    if (!notice_timer || ::timerfd_settime(notice_timer.get(), 0, &every, nullptr) != 0) {
      log::error("vrdmad: cannot start the peer notice timer: {}", std::strerror(errno));
      return 1;
    }
    (void)loop->add(notice_timer.get(), EPOLLIN, [&](std::uint32_t) {
      std::uint64_t n;
      [[maybe_unused]] auto r = ::read(notice_timer.get(), &n, sizeof n);
      if (auto st = follow_guest(); !st.ok()) log::error("vrdmad: peer notices: {}", st.error().message);
    });
  }

  UniqueFd ctl;
  std::unique_ptr<ControlConnections> control_conns;
  if (!control.empty()) {
    auto l = listen_unix(control);
    if (!l) {
      log::error("vrdmad: {}", l.error().message);
      return 1;
    }
    ctl = std::move(*l);
    control_conns = std::make_unique<ControlConnections>(*loop, ctl.get(), [&](const std::string& line,
                                                                              ControlConnections::Reply answer) {
      nlohmann::json reply;
      auto req = nlohmann::json::parse(line, nullptr, false);
      if (req.is_discarded() || !req.is_object() || !req.contains("cmd") || !req["cmd"].is_string()) {
        reply = {{"error", "the request is not a JSON object with a \"cmd\" string; send {\"cmd\":\"status\"}"}};
      } else if (req["cmd"] == "status" || req["cmd"] == "stats") {
        reply = stats_json(dev, mig, **srv, engine_name, **engine, domain, sock);
        if (!notices_ip.empty()) {
          reply["notices"]["listening"] = notices_listening();
          auto& where = reply["notices"]["addresses"] = nlohmann::json::array();
          for (const auto& nl : notice_listeners)
            where.push_back({{"address", migration::notice::to_string(nl.addr)}, {"listening", nl.server->listening()}});
        }
      } else if (req["cmd"] == "migrate") {
        if (!req.contains("to") || !req["to"].is_string()) {
          reply = {{"error", "migrate needs \"to\": the destination vrdmad's tcp:IP:PORT (its --incoming)"}};
        } else {
          const bool prestate = !req.contains("prestate") || !req["prestate"].is_boolean() || req["prestate"].get<bool>();
          // Answered once the destination accepted the guest or did not, the loop serving on meanwhile.
          auto st = mig.migrate_to(
              req["to"].get<std::string>(),
              [&mig, answer](const Status& done) {
                const auto r = done.ok() ? nlohmann::json{{"ok", true}, {"migration", migration_json(mig)}}
                                         : nlohmann::json{{"ok", false}, {"error", done.error().message}};
                answer(r.dump() + "\n");
              },
              std::chrono::seconds(5), prestate);
          if (st.ok()) return;
          reply = {{"ok", false}, {"error", st.error().message}};
        }
      } else if (req["cmd"] == "cancel") {
        auto st = mig.cancel("cancelled by the operator");
        reply = st.ok() ? nlohmann::json{{"ok", true}} : nlohmann::json{{"ok", false}, {"error", st.error().message}};
      } else {
        reply = {{"error", "unknown command " + req["cmd"].get<std::string>() +
                               "; commands: status, stats, migrate, cancel"}};
      }
      answer(reply.dump() + "\n");
    });
    if (auto st = control_conns->start(); !st.ok()) {
      log::error("vrdmad: {}", st.error().message);
      return 1;
    }
  }

  log::info("vrdmad: serving {} on engine {}{}{}", sock, engine_name, control.empty() ? "" : ", control " + control,
            incoming.empty() ? "" : ", waiting for an incoming guest on " + incoming);
  auto st = poll_us == 0 ? loop->run()
                         : loop->run_polling(std::chrono::microseconds(poll_us), [&] { return dev.poll_round(); },
                                             [&] { dev.poll_idle(); });
  if (!st.ok()) log::error("vrdmad: event loop failed: {}", st.error().message);
  log::info("vrdmad: exiting: {}", stats_json(dev, mig, **srv, engine_name, **engine, domain, sock).dump());
  if (!control.empty()) ::unlink(control.c_str());
  return st.ok() ? 0 : 1;
}
