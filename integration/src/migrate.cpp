#include "vrdma/integration/migrate.hpp"

#include <dirent.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

namespace vrdma::integration {
namespace {

using Clock = std::chrono::steady_clock;

std::string last_libvirt_error() {
  const virError* e = virGetLastError();
  return e && e->message ? e->message : "unknown libvirt error";
}

std::vector<std::string> rdma_devices() {
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/sys/class/infiniband")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
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

struct Events {
  std::mutex mu;
  bool completed = false;
  unsigned long long elapsed_ms = 0, downtime_ms = 0, iterations = 0, processed = 0, total = 0;
  std::atomic<int> iteration{0};
};

void on_iteration(virConnectPtr, virDomainPtr, int iteration, void* opaque) {
  auto* ev = static_cast<Events*>(opaque);
  ev->iteration = iteration;
  std::printf("Memory copy pass %d started.\n", iteration);
  std::fflush(stdout);
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

int usage() {
  std::fprintf(stderr,
               "usage: vrdmactl migrate DOMAIN DEST_URI [--connect SRC_URI] [--migrateuri URI] [--timeout S] "
               "[--parallel N]\n"
               "  DEST_URI      the destination libvirtd as the source libvirtd reaches it (qemu+tcp://host/system)\n"
               "  --connect     the source libvirtd (default $LIBVIRT_DEFAULT_URI or qemu:///system)\n"
               "  --migrateuri  QEMU's migration stream: tcp://host[:port] or rdma://host:port (default: tcp)\n"
               "  --timeout     abort the migration after S seconds (default 300)\n"
               "  --parallel    N parallel (multifd) TCP connections\n");
  return 2;
}

struct Conn {
  virConnectPtr c = nullptr;
  ~Conn() {
    if (c) virConnectClose(c);
  }
};
struct Dom {
  virDomainPtr d = nullptr;
  ~Dom() {
    if (d) virDomainFree(d);
  }
};

void silent_error(void*, virErrorPtr) {}

}  // namespace

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

TransportChoice choose_transport(const std::string& requested, const std::string& dest_host, const TransportFacts& f) {
  TransportChoice t;
  const bool want_rdma = requested.rfind("rdma://", 0) == 0;
  if (!want_rdma) {
    t.migrate_uri = requested;
    if (requested.empty() && !dest_host.empty()) t.migrate_uri = "tcp://" + dest_host;
    if (f.rdma_devices.empty())
      t.notes.push_back("This host has no RDMA device (/sys/class/infiniband is empty), so the memory goes over TCP.");
    else
      t.notes.push_back("The memory goes over TCP; pass --migrateuri rdma://HOST:PORT to use the RDMA device " +
                        f.rdma_devices.front() + ".");
    return t;
  }
  std::vector<std::string> why;
  if (f.rdma_devices.empty())
    why.push_back("this host has no RDMA device (/sys/class/infiniband is empty)");
  if (!f.hard_limit_set)
    why.push_back("the domain has no memory hard_limit (<memtune><hard_limit>), which libvirt demands to pin its "
                  "memory for RDMA");
  const bool memlock_ok = f.memlock_limit == ~0ULL || f.memlock_limit >= f.guest_memory;
  if (!memlock_ok && !f.cap_sys_resource)
    why.push_back("the locked-memory limit is " + mib(f.memlock_limit) + ", less than the guest's " +
                  mib(f.guest_memory) + ", and this process lacks CAP_SYS_RESOURCE to raise it");
  if (why.empty()) {
    t.migrate_uri = requested;
    t.rdma = true;
    t.notes.push_back("The memory goes over RDMA (" + requested + ", all guest memory pinned).");
    return t;
  }
  const std::string rest = requested.substr(7);
  t.migrate_uri = "tcp://" + rest;
  std::string s = "RDMA migration is not possible: ";
  for (std::size_t i = 0; i < why.size(); ++i) s += (i ? "; " : "") + why[i];
  t.notes.push_back(s + ". Falling back to TCP (" + t.migrate_uri + ").");
  return t;
}

int migrate_cli(const std::vector<std::string>& args) {
  std::vector<std::string> pos;
  std::string connect, migrate_uri;
  long timeout_s = 300, parallel = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= args.size()) return false;
      out = args[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") return usage();
    if (a == "--connect" || a == "-c") {
      if (!value(connect)) return usage();
    } else if (a == "--migrateuri") {
      if (!value(migrate_uri)) return usage();
    } else if (a == "--timeout") {
      if (!value(v) || (timeout_s = std::strtol(v.c_str(), nullptr, 10)) <= 0) return usage();
    } else if (a == "--parallel") {
      if (!value(v) || (parallel = std::strtol(v.c_str(), nullptr, 10)) <= 0) return usage();
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "vrdmactl migrate: unknown option %s\n", a.c_str());
      return usage();
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() != 2) return usage();
  const std::string& name = pos[0];
  const std::string& dest = pos[1];
  if (connect.empty()) {
    const char* e = std::getenv("LIBVIRT_DEFAULT_URI");
    connect = e && *e ? e : "qemu:///system";
  }

  virSetErrorFunc(nullptr, silent_error);
  if (virEventRegisterDefaultImpl() < 0) {
    std::fprintf(stderr, "vrdmactl migrate: cannot set up libvirt's event loop: %s\n", last_libvirt_error().c_str());
    return 1;
  }
  Conn conn;
  conn.c = virConnectOpen(connect.c_str());
  if (!conn.c) {
    std::fprintf(stderr, "vrdmactl migrate: cannot connect to the source libvirtd %s: %s\n", connect.c_str(),
                 last_libvirt_error().c_str());
    return 1;
  }
  Dom dom;
  dom.d = virDomainLookupByName(conn.c, name.c_str());
  if (!dom.d) {
    std::fprintf(stderr, "vrdmactl migrate: there is no domain %s on %s: %s\n", name.c_str(), connect.c_str(),
                 last_libvirt_error().c_str());
    return 1;
  }
  if (virDomainIsActive(dom.d) != 1) {
    std::fprintf(stderr, "vrdmactl migrate: domain %s is not running, so there is nothing to migrate live.\n",
                 name.c_str());
    return 1;
  }

  TransportFacts facts;
  facts.rdma_devices = rdma_devices();
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
  const auto choice = choose_transport(migrate_uri, uri_host(dest), facts);
  for (const auto& n : choice.notes) std::printf("%s\n", n.c_str());

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
  if (parallel > 0) {
    flags |= VIR_MIGRATE_PARALLEL;
    virTypedParamsAddInt(&params, &nparams, &maxparams, VIR_MIGRATE_PARAM_PARALLEL_CONNECTIONS,
                         static_cast<int>(parallel));
  }

  std::printf("Migrating domain %s from %s to %s%s%s.\n", name.c_str(), connect.c_str(), dest.c_str(),
              choice.migrate_uri.empty() ? "" : " over ", choice.migrate_uri.c_str());
  std::fflush(stdout);
  const auto t0 = Clock::now();
  std::atomic<bool> done{false}, timed_out{false};
  std::thread progress([&] {
    unsigned long long last_remaining = ~0ULL;
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (done) break;
      if (Clock::now() - t0 > std::chrono::seconds(timeout_s) && !timed_out) {
        timed_out = true;
        std::printf("The migration did not finish within %ld s; aborting it.\n", timeout_s);
        std::fflush(stdout);
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
            std::printf("[%-20s] %3d%%  %s of %s remaining (memory pass %d).\n",
                        std::string(static_cast<std::size_t>(pct / 5), '#').c_str(), pct, mib(remaining).c_str(),
                        mib(total).c_str(), ev.iteration.load());
            std::fflush(stdout);
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

  if (rc < 0) {
    std::fprintf(stderr, "vrdmactl migrate: the migration of %s to %s failed%s: %s\n", name.c_str(), dest.c_str(),
                 timed_out ? " (aborted after the timeout)" : "", err.c_str());
    std::fprintf(stderr, "The domain still runs on %s.\n", connect.c_str());
    return 1;
  }
  std::lock_guard lk(ev.mu);
  if (ev.completed) {
    std::printf("Domain %s now runs on %s: the migration took %llu ms with %llu ms of downtime, "
                "%llu memory passes, %s transferred.\n",
                name.c_str(), dest.c_str(), ev.elapsed_ms, ev.downtime_ms, ev.iterations, mib(ev.processed).c_str());
  } else {
    std::printf("Domain %s now runs on %s: the migration took %.0f ms (libvirt reported no job figures).\n",
                name.c_str(), dest.c_str(), wall * 1000);
  }
  return 0;
}

}  // namespace vrdma::integration
