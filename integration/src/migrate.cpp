#include "vrdma/integration/migrate.hpp"

#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "libvirt_handles.hpp"
#include <thread>

#include "commands.hpp"
#include "vf_pool.hpp"
#include "vrdma/integration/guest_vf.hpp"
#include "vrdma/integration/migration_vf.hpp"

namespace vrdma::integration {
namespace {

using Clock = std::chrono::steady_clock;

// The RDMA devices as sysfs shows them ($VRDMA_SYSFS_ROOT, /sys unless tests say otherwise).
std::string infiniband_dir() { return VfPaths::from_environment().sysfs_root + "/class/infiniband"; }

std::vector<std::string> rdma_devices() {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(infiniband_dir().c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

// The interfaces that carry a GID of an RDMA device (ports/*/gid_attrs/ndevs/*).
std::vector<std::string> gid_netdevs() {
  std::vector<std::string> out;
  const std::string root = infiniband_dir();
  auto entries = [](const std::string& dir) {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') names.emplace_back(e->d_name);
      ::closedir(d);
    }
    return names;
  };
  for (const auto& dev : entries(root))
    for (const auto& port : entries(root + "/" + dev + "/ports")) {
      const std::string ndevs = root + "/" + dev + "/ports/" + port + "/gid_attrs/ndevs";
      for (const auto& idx : entries(ndevs)) {
        std::ifstream f(ndevs + "/" + idx);
        std::string name;
        if (std::getline(f, name) && !name.empty() && std::find(out.begin(), out.end(), name) == out.end())
          out.push_back(name);
      }
    }
  return out;
}

// The interface this host's packets to `host` leave by: a UDP socket connected to it (nothing is
// sent) and the interface holding the source address the kernel chose. nullopt: the name does
// not resolve; "": no route.
std::optional<std::string> route_interface(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), "4791", &hints, &res) != 0 || res == nullptr) return std::nullopt;
  std::string ifname;
  const int s = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (s >= 0 && ::connect(s, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    ifaddrs* ifs = nullptr;
    if (::getifaddrs(&ifs) == 0) {
      for (const ifaddrs* i = ifs; i != nullptr && ifname.empty(); i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != local.ss_family) continue;
        if (local.ss_family == AF_INET) {
          const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
          const auto* b = reinterpret_cast<const sockaddr_in*>(&local);
          if (a->sin_addr.s_addr == b->sin_addr.s_addr) ifname = i->ifa_name;
        } else if (local.ss_family == AF_INET6) {
          const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
          const auto* b = reinterpret_cast<const sockaddr_in6*>(&local);
          if (std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0) ifname = i->ifa_name;
        }
      }
      ::freeifaddrs(ifs);
    }
  }
  if (s >= 0) ::close(s);
  ::freeaddrinfo(res);
  return ifname;
}

bool have_cap_sys_resource() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("CapEff:", 0) == 0) {
      const unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 24) & 1ULL;  // CAP_SYS_RESOURCE
    }
  return false;
}

std::string mib(unsigned long long bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

unsigned long long typed_ull(virTypedParameterPtr p, int n, const char* name) {
  unsigned long long v = 0;
  if (virTypedParamsGetULLong(p, n, name, &v) == 1) return v;
  return 0;
}

// Progress and notes: stdout, or stderr when --json keeps stdout for the one result object.
std::FILE* say = stdout;

struct Events {
  std::mutex mu;
  bool completed = false;
  unsigned long long elapsed_ms = 0, downtime_ms = 0, iterations = 0, processed = 0, total = 0;
  std::atomic<int> iteration{0};
};

void on_iteration(virConnectPtr, virDomainPtr, int iteration, void* opaque) {
  auto* ev = static_cast<Events*>(opaque);
  ev->iteration = iteration;
  std::fprintf(say, "Memory copy pass %d started.\n", iteration);
  std::fflush(say);
}

void on_job_completed(virConnectPtr, virDomainPtr, virTypedParameterPtr params, int n, void* opaque) {
  auto* ev = static_cast<Events*>(opaque);
  std::lock_guard lk(ev->mu);
  ev->completed = true;
  ev->elapsed_ms = typed_ull(params, n, VIR_DOMAIN_JOB_TIME_ELAPSED);
  ev->downtime_ms = typed_ull(params, n, VIR_DOMAIN_JOB_DOWNTIME);
  ev->iterations = typed_ull(params, n, VIR_DOMAIN_JOB_MEMORY_ITERATION);
  ev->processed = typed_ull(params, n, VIR_DOMAIN_JOB_DATA_PROCESSED);
  ev->total = typed_ull(params, n, VIR_DOMAIN_JOB_DATA_TOTAL);
}

}  // namespace

std::string device_migration_note(const std::string& domain, const std::string& engine) {
  if (engine.rfind("verbs:", 0) != 0) return {};
  return "Domain " + domain + "'s RDMA device runs on a NIC (engine " + engine +
         "): its QPs are drained, stopped and re-created on the destination's NIC under new numbers (the guest keeps "
         "its own). Connections between QPs of this guest carry on; every RDMA peer outside the guest keeps "
         "sending to the old numbers, sees its retries run out, and must connect again (docs/migration.md \"On a "
         "NIC\"). Stop the guest's RDMA work with other hosts first if that matters.";
}

std::string uri_host(const std::string& uri) {
  std::string s = uri;
  if (const auto p = s.find("://"); p != std::string::npos) {
    s = s.substr(p + 3);
  } else if (const auto c = s.find(':'); c != std::string::npos) {
    s = s.substr(c + 1);  // tcp:host:port
  }
  if (const auto at = s.find('@'); at != std::string::npos) s = s.substr(at + 1);
  s = s.substr(0, s.find_first_of("/?"));
  if (!s.empty() && s[0] == '[') return s.substr(1, s.find(']') - 1);
  return s.substr(0, s.find(':'));
}

namespace {

// TCP: multifd with `parallel` connections (-1: the default), said in one sentence.
void tcp_streams(TransportChoice& t, int parallel) {
  const int n = parallel < 0 ? kDefaultMultifdChannels : parallel;
  if (n > 1) {
    t.parallel = n;
    t.notes.push_back("The memory goes over " + std::to_string(n) + " parallel TCP connections (multifd); --parallel 1 "
                      "makes it one stream.");
  } else {
    t.notes.push_back("The memory goes over one TCP stream.");
  }
}

}  // namespace

TransportChoice choose_transport(const std::string& requested, const std::string& dest_host, const TransportFacts& f,
                                 int parallel) {
  TransportChoice t;
  const bool want_rdma = requested.rfind("rdma://", 0) == 0;
  if (!want_rdma) {
    t.migrate_uri = requested;
    if (requested.empty() && !dest_host.empty()) t.migrate_uri = "tcp://" + dest_host;
    if (f.rdma_devices.empty())
      t.notes.push_back("This host has no RDMA device (" + infiniband_dir() + " is empty), so the memory goes over TCP.");
    else
      t.notes.push_back("The memory goes over TCP; pass --migrateuri rdma://HOST:PORT to use the RDMA device " +
                        f.rdma_devices.front() + ".");
    tcp_streams(t, parallel);
    return t;
  }
  std::vector<std::string> why;
  if (!f.migration_vf_error.empty()) why.push_back("this host's migration VF could not be set up: " + f.migration_vf_error);
  if (f.rdma_devices.empty())
    why.push_back("this host has no RDMA device (" + infiniband_dir() + " is empty)");
  if (!f.hard_limit_set)
    why.push_back("the domain has no memory hard_limit (<memtune><hard_limit>), which libvirt demands to pin its "
                  "memory for RDMA");
  if (f.route_checked) {
    const std::string host = uri_host(requested);
    if (f.route_ifname.empty()) {
      why.push_back("the destination " + host + " is not reachable from this host (no route)");
    } else if (std::find(f.gid_ifnames.begin(), f.gid_ifnames.end(), f.route_ifname) == f.gid_ifnames.end()) {
      std::string on;
      for (const auto& n : f.gid_ifnames) on += (on.empty() ? "" : ", ") + n;
      why.push_back("the destination " + host + " is reached through " + f.route_ifname +
                    ", which carries no RDMA GID" + (on.empty() ? "" : " (RDMA GIDs are on " + on + ")") +
                    ", so no RDMA connection can get there");
    }
  }
  const bool memlock_ok = f.memlock_limit == ~0ULL || f.memlock_limit >= f.guest_memory;
  if (!memlock_ok && !f.cap_sys_resource)
    why.push_back("the locked-memory limit is " + mib(f.memlock_limit) + ", less than the guest's " +
                  mib(f.guest_memory) + ", and this process lacks CAP_SYS_RESOURCE to raise it");
  if (why.empty()) {
    t.migrate_uri = requested;
    t.rdma = true;
    t.notes.push_back("The memory goes over RDMA (" + requested + ", all guest memory pinned).");
    if (parallel > 1) t.notes.push_back("--parallel is ignored: QEMU's RDMA transport is one connection.");
    return t;
  }
  const std::string rest = requested.substr(7);
  t.migrate_uri = "tcp://" + rest;
  std::string s = "RDMA migration is not possible: ";
  for (std::size_t i = 0; i < why.size(); ++i) s += (i ? "; " : "") + why[i];
  t.notes.push_back(s + ". Falling back to TCP (" + t.migrate_uri + ").");
  tcp_streams(t, parallel);
  return t;
}

namespace {

struct MigrateArgs {
  std::string name, dest, connect, migrate_uri;
  long timeout_s = 300, parallel = -1, bandwidth = 0;
  bool suspend = false, json = false;
};

int migrate(const MigrateArgs& a) {
  say = a.json ? stderr : stdout;
  // With --json every ending is one object on stdout too.
  auto result = [&](bool ok, const nlohmann::json& extra) {
    if (a.json) {
      nlohmann::json j{{"ok", ok}, {"domain", a.name}, {"destination", a.dest}};
      j.update(extra);
      std::printf("%s\n", j.dump().c_str());
    }
    return ok ? 0 : 1;
  };
  auto failed = [&](const std::string& sentence) {
    std::fprintf(stderr, "vrdmactl migrate: %s\n", sentence.c_str());
    return result(false, {{"error", sentence}});
  };
  const std::string& name = a.name;
  const std::string& dest = a.dest;
  const std::string connect = libvirt_uri(a.connect);
  const std::string& migrate_uri = a.migrate_uri;
  const long timeout_s = a.timeout_s, parallel = a.parallel, bandwidth = a.bandwidth;
  const bool suspend = a.suspend;

  virSetErrorFunc(nullptr, silent_libvirt_error);
  if (virEventRegisterDefaultImpl() < 0) {
    return failed("cannot set up libvirt's event loop: " + last_libvirt_error());
  }
  Conn conn;
  conn.c = virConnectOpen(connect.c_str());
  if (!conn.c) {
    return failed("cannot connect to the source libvirtd " + connect + ": " + last_libvirt_error());
  }
  Dom dom;
  dom.d = virDomainLookupByName(conn.c, name.c_str());
  if (!dom.d) {
    return failed("there is no domain " + name + " on " + connect + ": " + last_libvirt_error());
  }
  if (virDomainIsActive(dom.d) != 1) {
    return failed("domain " + name + " is not running, so there is nothing to migrate live.");
  }

  if (char* xml = virDomainGetXMLDesc(dom.d, 0)) {
    auto info = parse_domain(xml);
    std::free(xml);
    if (info && info->device && info->device->backend == BackendKind::vrdmad)
      if (auto note = device_migration_note(name, info->device->engine); !note.empty()) std::fprintf(say, "%s\n", note.c_str());
  }

  TransportFacts facts;
  if (migrate_uri.rfind("rdma://", 0) == 0) {
    // This host's migration VF first: its netdev is where the route to the destination should
    // leave, and its RDMA device is what QEMU's rdma:// uses.
    auto net = MigrationNet::from_host_settings();
    if (!net) {
      facts.migration_vf_error = net.error().message;
    } else if (*net) {
      auto m = ensure_migration_vf(VfPaths::from_environment(), **net, short_hostname());
      if (!m)
        facts.migration_vf_error = m.error().message;
      else
        std::fprintf(say, "This host's migration VF %s (RDMA device %s, netdev %s) carries %s%s.\n", m->vf.c_str(),
                    m->ibdev.c_str(), m->netdev.c_str(), m->address.c_str(),
                    m->reused ? "" : " (taken from the pool now; 'vrdmactl migration-vf release' gives it back)");
    }
  }
  facts.rdma_devices = rdma_devices();
  if (migrate_uri.rfind("rdma://", 0) == 0) {
    if (auto r = route_interface(uri_host(migrate_uri))) {
      facts.route_checked = true;
      facts.route_ifname = *r;
      facts.gid_ifnames = gid_netdevs();
    }
  }
  {
    int n = 0;
    virDomainGetMemoryParameters(dom.d, nullptr, &n, 0);
    std::vector<virTypedParameter> p(static_cast<std::size_t>(n > 0 ? n : 0));
    if (n > 0 && virDomainGetMemoryParameters(dom.d, p.data(), &n, 0) == 0) {
      unsigned long long hard = 0;
      if (virTypedParamsGetULLong(p.data(), n, VIR_DOMAIN_MEMORY_HARD_LIMIT, &hard) == 1)
        facts.hard_limit_set = hard != VIR_DOMAIN_MEMORY_PARAM_UNLIMITED && hard != 0;
    }
    virDomainInfo info{};
    if (virDomainGetInfo(dom.d, &info) == 0) facts.guest_memory = static_cast<unsigned long long>(info.maxMem) * 1024;
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
      facts.memlock_limit = rl.rlim_cur == RLIM_INFINITY ? ~0ULL : static_cast<unsigned long long>(rl.rlim_cur);
    facts.cap_sys_resource = have_cap_sys_resource();
  }
  const auto choice = choose_transport(migrate_uri, uri_host(dest), facts, static_cast<int>(parallel));
  for (const auto& n : choice.notes) std::fprintf(say, "%s\n", n.c_str());

  Events ev;
  const int id_iter = virConnectDomainEventRegisterAny(conn.c, dom.d, VIR_DOMAIN_EVENT_ID_MIGRATION_ITERATION,
                                                       VIR_DOMAIN_EVENT_CALLBACK(on_iteration), &ev, nullptr);
  const int id_done = virConnectDomainEventRegisterAny(conn.c, dom.d, VIR_DOMAIN_EVENT_ID_JOB_COMPLETED,
                                                       VIR_DOMAIN_EVENT_CALLBACK(on_job_completed), &ev, nullptr);
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    while (!stop) virEventRunDefaultImpl();
  });
  // A timer keeps virEventRunDefaultImpl returning so that the loop sees `stop`.
  const int timer = virEventAddTimeout(100, [](int, void*) {}, nullptr, nullptr);

  virTypedParameterPtr params = nullptr;
  int nparams = 0, maxparams = 0;
  if (!choice.migrate_uri.empty())
    virTypedParamsAddString(&params, &nparams, &maxparams, VIR_MIGRATE_PARAM_URI, choice.migrate_uri.c_str());
  unsigned flags = VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER;
  if (choice.rdma) flags |= VIR_MIGRATE_RDMA_PIN_ALL;
  if (suspend) flags |= VIR_MIGRATE_PAUSED;
  if (bandwidth > 0)
    virTypedParamsAddULLong(&params, &nparams, &maxparams, VIR_MIGRATE_PARAM_BANDWIDTH,
                            static_cast<unsigned long long>(bandwidth));
  if (choice.parallel > 1) {
    flags |= VIR_MIGRATE_PARALLEL;
    virTypedParamsAddInt(&params, &nparams, &maxparams, VIR_MIGRATE_PARAM_PARALLEL_CONNECTIONS, choice.parallel);
  }

  std::fprintf(say, "Migrating domain %s from %s to %s%s%s.\n", name.c_str(), connect.c_str(), dest.c_str(),
              choice.migrate_uri.empty() ? "" : " over ", choice.migrate_uri.c_str());
  if (bandwidth > 0) std::fprintf(say, "The memory copy is limited to %ld MiB/s.\n", bandwidth);
  std::fflush(say);
  const auto t0 = Clock::now();
  std::atomic<bool> done{false}, timed_out{false};
  std::thread progress([&] {
    unsigned long long last_remaining = ~0ULL;
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (done) break;
      if (Clock::now() - t0 > std::chrono::seconds(timeout_s) && !timed_out) {
        timed_out = true;
        std::fprintf(say, "The migration did not finish within %ld s; aborting it.\n", timeout_s);
        std::fflush(say);
        virDomainAbortJob(dom.d);
      }
      int type = 0;
      virTypedParameterPtr p = nullptr;
      int n = 0;
      if (virDomainGetJobStats(dom.d, &type, &p, &n, 0) == 0) {
        if (type != VIR_DOMAIN_JOB_NONE) {
          const auto total = typed_ull(p, n, VIR_DOMAIN_JOB_MEMORY_TOTAL);
          const auto remaining = typed_ull(p, n, VIR_DOMAIN_JOB_DATA_REMAINING);
          if (total && remaining != last_remaining) {
            const int pct = static_cast<int>(100 - (remaining * 100) / (total ? total : 1));
            std::fprintf(say, "[%-20s] %3d%%  %s of %s remaining (memory pass %d).\n",
                        std::string(static_cast<std::size_t>(pct / 5), '#').c_str(), pct, mib(remaining).c_str(),
                        mib(total).c_str(), ev.iteration.load());
            std::fflush(say);
            last_remaining = remaining;
          }
        }
        virTypedParamsFree(p, n);
      }
    }
  });
  const int rc = virDomainMigrateToURI3(dom.d, dest.c_str(), params, static_cast<unsigned>(nparams), flags);
  const std::string err = rc < 0 ? last_libvirt_error() : "";
  done = true;
  progress.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (rc == 0) {  // JOB_COMPLETED comes as an event; give it a moment to arrive
    for (int i = 0; i < 40; ++i) {
      {
        std::lock_guard lk(ev.mu);
        if (ev.completed) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  virTypedParamsFree(params, nparams);
  if (id_iter >= 0) virConnectDomainEventDeregisterAny(conn.c, id_iter);
  if (id_done >= 0) virConnectDomainEventDeregisterAny(conn.c, id_done);
  stop = true;
  loop.join();
  if (timer >= 0) virEventRemoveTimeout(timer);

  if (rc < 0)
    return failed("the migration of " + name + " to " + dest + " failed" +
                  (timed_out ? " (aborted after the timeout)" : "") + ": " + err + ". The domain still runs on " +
                  connect + ".");
  std::lock_guard lk(ev.mu);
  const char* now = suspend ? "is now paused on" : "now runs on";
  nlohmann::json figures{{"transport", choice.migrate_uri.empty() ? "libvirt's default" : choice.migrate_uri},
                         {"rdma", choice.rdma}, {"suspended", suspend}};
  if (ev.completed) {
    std::fprintf(say, "Domain %s %s %s: the migration took %llu ms with %llu ms of downtime, "
                      "%llu memory passes, %s transferred.\n",
                 name.c_str(), now, dest.c_str(), ev.elapsed_ms, ev.downtime_ms, ev.iterations, mib(ev.processed).c_str());
    figures.update({{"elapsed_ms", ev.elapsed_ms}, {"downtime_ms", ev.downtime_ms}, {"memory_passes", ev.iterations},
                    {"bytes_transferred", ev.processed}});
  } else {
    std::fprintf(say, "Domain %s %s %s: the migration took %.0f ms (libvirt reported no job figures).\n",
                 name.c_str(), now, dest.c_str(), wall * 1000);
    figures["elapsed_ms"] = static_cast<unsigned long long>(wall * 1000);
  }
  if (suspend) std::fprintf(say, "It runs once resumed there: virsh -c %s resume %s\n", dest.c_str(), name.c_str());
  return result(true, figures);
}

}  // namespace

void add_migrate_command(CLI::App& top, Commands& out) {
  auto a = std::make_shared<MigrateArgs>();
  auto* m = top.add_subcommand("migrate", "live-migrate a libvirt domain with its virtio RDMA device, with progress");
  m->add_option("domain", a->name, "the domain's name")->required();
  m->add_option("dest_uri", a->dest, "the destination libvirtd as the source libvirtd reaches it (qemu+tcp://host/system)")
      ->required();
  m->add_option("-c,--connect", a->connect, "the source libvirtd (default $LIBVIRT_DEFAULT_URI or qemu:///system)");
  m->add_option("--migrateuri", a->migrate_uri,
                "QEMU's migration stream: tcp://host[:port] or rdma://host:port (default: tcp)");
  m->add_option("--timeout", a->timeout_s, "abort the migration after S seconds")->capture_default_str()
      ->check(CLI::Range(1L, 86400L));
  m->add_option("--parallel", a->parallel, "N parallel (multifd) TCP connections (default 2; 1: one stream)")
      ->check(CLI::Range(1L, 255L));
  m->add_option("--bandwidth", a->bandwidth,
                "at most MIB MiB/s for the memory copy (default: no limit; docs/integration.md says why a limit helps "
                "TCG guests under QEMU 7.2)")
      ->check(CLI::Range(1L, 1L << 30));
  m->add_flag("--suspend", a->suspend,
              "leave the domain paused on the destination (virsh resume DOMAIN runs it), as virsh migrate --suspend does");
  m->add_flag("--json", a->json,
              "one JSON object on stdout at the end (ok, timings, transport or error); progress goes to stderr");
  out.push_back({m, [a] { return migrate(*a); }});
}

}  // namespace vrdma::integration
