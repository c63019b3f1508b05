#include "vrdma/integration/hook.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "backend_proc.hpp"
#include "vrdma/integration/domain_xml.hpp"
#include "vf_pool.hpp"
#include "vrdma/integration/guest_vf.hpp"
#include "vrdma/integration/migration_vf.hpp"

namespace vrdma::integration {
namespace {

void trace(const std::string& line) {
  const char* p = std::getenv("VRDMA_HOOK_LOG");
  if (!p || !*p) return;
  std::ofstream(p, std::ios::app) << line << "\n";
}

const char* kind_name(BackendKind k) { return k == BackendKind::vrdmad ? "vrdmad" : "vhost-user-blk"; }

}  // namespace

Result<std::string> start_device_backend(const std::string& domain, const std::string& host, const DeviceMeta& m,
                                         bool incoming, bool migrating, const BackendPrograms& progs) {
  const std::string what = std::string(migrating ? "incoming " : "") + "domain " + domain + " on " + host;
  auto backend_failed = [&](const Error& e, const std::string& extra) {
    return Error{e.code, "cannot start the " + std::string(kind_name(m.backend)) + " backend for " + what + ": " +
                             e.message + extra};
  };
  if (!m.vf || backend_pid(m) != 0) {
    if (auto st = ensure_backend(m, incoming, progs); !st.ok()) return backend_failed(st.error(), "");
    return std::string();
  }
  const auto paths = VfPaths::from_environment();
  const auto owner = vf_owner(domain, host);
  auto vf = assign_guest_vf(paths, m, owner);
  if (!vf) return Error{vf.error().code, "cannot give " + what + " a VF: " + vf.error().message};
  const DeviceMeta run = backend_for_vf(m, *vf);
  auto give_back = [&](const Error& e) {
    auto r = release_guest_vf(paths, m, owner);
    const std::string extra = !r   ? "; VF " + vf->vf + " could not be given back (" + r.error().message +
                                         "): free it with 'vrdmactl vf release --owner " + owner + "'"
                              : "; VF " + vf->vf + " was given back to the pool";
    return backend_failed(e, extra);
  };
  if (auto st = ensure_backend(run, incoming, progs); !st.ok()) return give_back(st.error());
  const int pid = backend_pid(run);
  Status handed = pid > 0 ? hand_over_guest_vf(paths, *vf, pid)
                          : Status(make_error(Errc::io_error, "the backend exited right after it started"));
  if (!handed.ok()) {
    (void)stop_backend(run);
    return give_back(handed.error());
  }
  return std::string(vf->reused ? " with its VF " : " with VF ") + vf->vf + " (" + vf->ibdev + ", engine " +
         run.engine + ", MAC " + run.mac + ")";
}

Result<StoppedBackend> stop_device_backend(const std::string& domain, const std::string& host, const DeviceMeta& dev) {
  (void)stop_backend(dev);
  if (!dev.vf) return StoppedBackend{};
  const auto owner = vf_owner(domain, host);
  auto r = release_guest_vf(VfPaths::from_environment(), dev, owner);
  if (!r)
    return Error{r.error().code, "cannot give the VF of domain " + domain + " back to the pool on " + host + ": " +
                                     r.error().message + "; 'vrdmactl vf release --owner " + owner + "' does it by hand"};
  if (!*r) return StoppedBackend{};
  return StoppedBackend{(*r)->vf, (*r)->warning};
}

std::string StoppedBackend::log_part() const {
  if (vf.empty()) return {};
  return ", released VF " + vf + (warning.empty() ? "" : " (" + warning + ")");
}

int hook_qemu_run(const std::vector<std::string>& args, std::istream& in, std::ostream& out, std::ostream& err) {
  if (args.size() < 3) {
    err << "usage: vrdmactl hook qemu DOMAIN OPERATION SUB-OPERATION [EXTRA] (the domain XML on stdin)\n";
    return 2;
  }
  const std::string& domain = args[0];
  const std::string& op = args[1];
  const std::string& sub = args[2];
  const bool migrate = op == "migrate" && sub == "begin";
  const bool ensure = (op == "prepare" || op == "start") && sub == "begin";
  const bool release = op == "release" && sub == "end";
  if (!migrate && !ensure && !release) return 0;
  const auto host = short_hostname();
  // An incoming migration may come over rdma:// to this host's migration address: the migration
  // VF must carry it before QEMU listens there. A failure does not stop the migration (TCP ones
  // need no VF); it is said, and an RDMA one then fails in QEMU with libvirt's own error.
  if (migrate) {
    auto net = MigrationNet::from_host_settings();
    if (!net) {
      err << "vrdma hook: " << net.error().message << "\n";
      trace(host + " " + domain + " migrate begin: no migration VF: " + net.error().message);
    } else if (*net) {
      auto m = ensure_migration_vf(VfPaths::from_environment(), **net, host);
      if (!m) {
        err << "vrdma hook: the migration VF of " << host << " could not be set up, so RDMA migrations to it fail "
            << "(TCP ones are not affected): " << m.error().message << "\n";
        trace(host + " " + domain + " migrate begin: no migration VF: " + m.error().message);
      } else {
        trace(host + " " + domain + " migrate begin: migration VF " + m->vf + " (" + m->ibdev + ", netdev " + m->netdev +
              ") carries " + m->address + (m->reused ? "" : " (taken from the pool now)"));
      }
    }
  }

  std::string xml;
  for (char buf[4096]; in.read(buf, sizeof buf) || in.gcount() > 0;) xml.append(buf, static_cast<std::size_t>(in.gcount()));
  auto dom = parse_domain(xml);
  if (!dom) {
    err << "vrdma hook: domain " << domain << ": " << dom.error().message << "\n";
    return 1;
  }
  if (!dom->device) return 0;  // not ours: print nothing, so libvirt keeps its XML
  const auto progs = BackendPrograms::from_environment();
  const auto& dev = *dom->device;

  if (migrate) {
    const DeviceMeta here = for_host(*dom, host);
    auto rewritten = rewrite_sockets(xml, dev, here);
    if (!rewritten) {
      err << "vrdma hook: domain " << domain << ": " << rewritten.error().message << "\n";
      return 1;
    }
    const bool incoming = here.backend == BackendKind::vrdmad;
    auto started = start_device_backend(domain, host, here, incoming, true, progs);
    if (!started) {
      err << "vrdma hook: " << started.error().message << "\n";
      return 1;
    }
    trace(host + " " + domain + " migrate begin: started " + kind_name(here.backend) + (incoming ? " --incoming" : "") +
          *started + " on " + here.socket + " (was " + dev.socket + ")");
    out << *rewritten;
    return 0;
  }
  if (ensure) {
    const bool was = backend_pid(dev) != 0;
    auto started = start_device_backend(domain, host, dev, false, false, progs);
    if (!started) {
      err << "vrdma hook: " << started.error().message << "\n";
      return 1;
    }
    trace(host + " " + domain + " " + op + " begin: " + (was ? "backend already runs" : "started backend" + *started) +
          " on " + dev.socket);
    return 0;
  }
  auto freed = stop_device_backend(domain, host, dev);
  if (!freed) {
    err << "vrdma hook: " << freed.error().message << "\n";
    trace(host + " " + domain + " release end: stopped backend on " + dev.socket);
    return 1;
  }
  if (!freed->warning.empty()) err << "vrdma hook: domain " << domain << ": " << freed->warning << "\n";
  trace(host + " " + domain + " release end: stopped backend on " + dev.socket + freed->log_part());
  return 0;
}

}  // namespace vrdma::integration
