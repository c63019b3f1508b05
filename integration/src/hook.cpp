#include "vrdma/integration/hook.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "backend_proc.hpp"
#include "vrdma/integration/domain_xml.hpp"

namespace vrdma::integration {
namespace {

std::string hostname() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "localhost";
  std::string s(h);
  return s.substr(0, s.find('.'));
}

void trace(const std::string& line) {
  const char* p = std::getenv("VRDMA_HOOK_LOG");
  if (!p || !*p) return;
  std::ofstream(p, std::ios::app) << line << "\n";
}

const char* kind_name(BackendKind k) { return k == BackendKind::vrdmad ? "vrdmad" : "vhost-user-blk"; }

}  // namespace

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

  std::string xml;
  for (char buf[4096]; in.read(buf, sizeof buf) || in.gcount() > 0;) xml.append(buf, static_cast<std::size_t>(in.gcount()));
  auto dom = parse_domain(xml);
  if (!dom) {
    err << "vrdma hook: domain " << domain << ": " << dom.error().message << "\n";
    return 1;
  }
  if (!dom->device) return 0;  // not ours: print nothing, so libvirt keeps its XML
  const auto host = hostname();
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
    if (auto st = ensure_backend(here, incoming, progs); !st.ok()) {
      err << "vrdma hook: cannot start the " << kind_name(here.backend) << " backend for incoming domain " << domain
          << " on " << host << ": " << st.error().message << "\n";
      return 1;
    }
    trace(host + " " + domain + " migrate begin: started " + kind_name(here.backend) + (incoming ? " --incoming" : "") +
          " on " + here.socket + " (was " + dev.socket + ")");
    out << *rewritten;
    return 0;
  }
  if (ensure) {
    const bool was = backend_pid(dev) != 0;
    if (auto st = ensure_backend(dev, false, progs); !st.ok()) {
      err << "vrdma hook: cannot start the " << kind_name(dev.backend) << " backend for domain " << domain << " on "
          << host << ": " << st.error().message << "\n";
      return 1;
    }
    trace(host + " " + domain + " " + op + " begin: " + (was ? "backend already runs" : "started backend") + " on " +
          dev.socket);
    return 0;
  }
  (void)stop_backend(dev);
  trace(host + " " + domain + " release end: stopped backend on " + dev.socket);
  return 0;
}

}  // namespace vrdma::integration
