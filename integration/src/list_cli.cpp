// `vrdmactl list`: every vrdmad whose control socket is in the run folder, with its counters.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend_proc.hpp"
#include "vrdma/common/table.hpp"
#include "commands.hpp"

namespace vrdma::integration {
namespace {

std::uint64_t num(const nlohmann::json& j, const char* a, const char* b = nullptr) {
  const nlohmann::json* v = &j;
  for (const char* k : {a, b}) {
    if (k == nullptr) break;
    if (!v->is_object() || !v->contains(k)) return 0;
    v = &(*v)[k];
  }
  return v->is_number_unsigned() ? v->get<std::uint64_t>() : 0;
}

std::string str(const nlohmann::json& j, const char* a, const char* b = nullptr) {
  const nlohmann::json* v = &j;
  for (const char* k : {a, b}) {
    if (k == nullptr) break;
    if (!v->is_object() || !v->contains(k)) return "";
    v = &(*v)[k];
  }
  return v->is_string() ? v->get<std::string>() : "";
}

// 1234567 -> "1.2M": the table stays narrow; --json has the exact numbers.
std::string human(std::uint64_t v) {
  const char* unit[] = {"", "k", "M", "G", "T", "P"};
  double d = static_cast<double>(v);
  int u = 0;
  while (d >= 1000 && u < 5) {
    d /= 1000;
    ++u;
  }
  char b[32];
  std::snprintf(b, sizeof b, u == 0 ? "%.0f%s" : "%.1f%s", d, unit[u]);
  return b;
}

// Everything a backend counted as refused or lost: bad commands, doorbells and WQEs, CQ
// overruns, dropped events, packets the engine dropped.
std::uint64_t errors(const nlohmann::json& s) {
  return num(s, "command_errors") + num(s, "doorbell_errors") + num(s, "wqe_errors") + num(s, "cq_overruns") +
         num(s, "events_dropped") + num(s, "wire", "rx_dropped");
}

struct ListArgs {
  std::string dir = "/run/vrdma";
  bool json = false, prometheus = false;
};

// A label value in Prometheus' text format: backslash, double quote and newline escaped.
std::string label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

// Prometheus' text exposition format (node_exporter's textfile collector reads it): one family
// per counter, one sample per backend that answered, labelled with its domain, engine and socket.
void print_prometheus(const nlohmann::json& backends) {
  struct Family {
    const char* name;
    const char* type;
    const char* help;
    const char* a;
    const char* b;
  };
  const Family families[] = {
      {"vrdma_up", "gauge", "1 when the backend answered its control socket", nullptr, nullptr},
      {"vrdma_connected", "gauge", "1 while QEMU is connected to the backend", "connected", nullptr},
      {"vrdma_qps", "gauge", "queue pairs of the guest device", "objects", "qp"},
      {"vrdma_cqs", "gauge", "completion queues of the guest device", "objects", "cq"},
      {"vrdma_mrs", "gauge", "memory regions of the guest device", "objects", "mr"},
      {"vrdma_registered_bytes", "gauge", "guest memory registered with the engine", "registered_bytes", nullptr},
      {"vrdma_wire_tx_packets_total", "counter", "RDMA packets the engine sent", "wire", "tx_packets"},
      {"vrdma_wire_rx_packets_total", "counter", "RDMA packets the engine received", "wire", "rx_packets"},
      {"vrdma_wire_tx_bytes_total", "counter", "bytes the engine sent", "wire", "tx_bytes"},
      {"vrdma_wire_rx_bytes_total", "counter", "bytes the engine received", "wire", "rx_bytes"},
      {"vrdma_wire_retransmits_total", "counter", "packets the engine sent again", "wire", "retransmits"},
      {"vrdma_wire_rx_dropped_total", "counter", "received packets the engine dropped", "wire", "rx_dropped"},
      {"vrdma_send_wqes_total", "counter", "send work requests the guest posted", "send_wqes", nullptr},
      {"vrdma_recv_wqes_total", "counter", "receive work requests the guest posted", "recv_wqes", nullptr},
      {"vrdma_cqes_total", "counter", "completions written to the guest", "cqes", nullptr},
      {"vrdma_doorbells_total", "counter", "doorbells the guest rang", "doorbells", nullptr},
      {"vrdma_errors_total", "counter", "refused commands, doorbells and WQEs, CQ overruns, dropped events and packets",
       nullptr, nullptr},
  };
  for (const auto& f : families) {
    std::printf("# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.type);
    for (const auto& b : backends) {
      const bool up = b.contains("status");
      const nlohmann::json& s = up ? b["status"] : b;
      std::uint64_t v = 0;
      if (std::string(f.name) == "vrdma_up") v = up ? 1 : 0;
      else if (!up) continue;
      else if (std::string(f.name) == "vrdma_errors_total") v = errors(s);
      else if (std::string(f.name) == "vrdma_connected") v = s.value("connected", false) ? 1 : 0;
      else v = num(s, f.a, f.b);
      std::printf("%s{domain=\"%s\",engine=\"%s\",control=\"%s\"} %llu\n", f.name, label(str(s, "domain")).c_str(),
                  label(str(s, "engine")).c_str(), label(b["control"].get<std::string>()).c_str(),
                  static_cast<unsigned long long>(v));
    }
  }
}

int list(const ListArgs& a) {
  std::error_code ec;
  std::vector<std::string> controls;
  for (const auto& e : std::filesystem::directory_iterator(a.dir, ec)) {
    struct stat st {};
    if (e.path().extension() == ".ctl" && ::stat(e.path().c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
      controls.push_back(e.path().string());
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    std::fprintf(stderr, "vrdmactl list: cannot read %s: %s\n", a.dir.c_str(), ec.message().c_str());
    return 1;
  }
  std::sort(controls.begin(), controls.end());
  nlohmann::json all = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows{{"DOMAIN", "ENGINE", "STATE", "QP", "CQ", "MR", "TX PKTS", "RX PKTS",
                                              "TX BYTES", "RX BYTES", "RETRANS", "ERRORS", "CONTROL"}};
  for (const auto& c : controls) {
    auto r = control_json(c, {{"cmd", "status"}}, 2000);
    if (!r) {
      all.push_back({{"control", c}, {"error", r.error().message}});
      rows.push_back({"-", "-", "not answering", "-", "-", "-", "-", "-", "-", "-", "-", "-", c});
      continue;
    }
    const nlohmann::json& s = *r;
    all.push_back({{"control", c}, {"status", s}});
    const std::string phase = str(s, "migration", "phase");
    const bool connected = s.value("connected", false);
    std::string state = connected ? "serving" : "waiting for QEMU";
    if (!phase.empty() && phase != "idle" && phase != "running") state += " (" + phase + ")";
    rows.push_back({str(s, "domain").empty() ? "-" : str(s, "domain"), str(s, "engine"), state,
                    std::to_string(num(s, "objects", "qp")), std::to_string(num(s, "objects", "cq")),
                    std::to_string(num(s, "objects", "mr")), human(num(s, "wire", "tx_packets")),
                    human(num(s, "wire", "rx_packets")), human(num(s, "wire", "tx_bytes")),
                    human(num(s, "wire", "rx_bytes")), std::to_string(num(s, "wire", "retransmits")),
                    std::to_string(errors(s)), c});
  }
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"dir", a.dir}, {"backends", all}}.dump().c_str());
    return 0;
  }
  if (a.prometheus) {
    print_prometheus(all);
    return 0;
  }
  if (controls.empty()) {
    std::printf("No vrdmad backend has a control socket in %s.\n", a.dir.c_str());
    return 0;
  }
  std::fflush(stdout);
  print_table(std::cout, rows);
  return std::cout ? 0 : 1;
}

}  // namespace

void add_list_command(CLI::App& top, Commands& out) {
  auto a = std::make_shared<ListArgs>();
  auto* l = top.add_subcommand("list", "every vrdmad backend on this host (its control socket in --dir): domain, "
                                       "engine, state, objects, packets and bytes on the wire, retransmissions, errors");
  l->add_option("--dir", a->dir, "where the backends' control sockets are (*.ctl)")->capture_default_str();
  auto* json = l->add_flag("--json", a->json, "one JSON object: each backend's control socket and vrdmad's whole status");
  l->add_flag("--prometheus", a->prometheus,
              "the counters in Prometheus' text format (for node_exporter's textfile collector)")
      ->excludes(json);
  out.push_back({l, [a] { return list(*a); }});
}

}  // namespace vrdma::integration
