// `vrdmactl device status|migrate`: vrdmad's control socket (one JSON request line, one reply line).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "backend_proc.hpp"
#include "vrdma/integration/migrate.hpp"

namespace vrdma::integration {
namespace {

int usage() {
  std::fprintf(stderr,
               "usage: vrdmactl device status --control PATH\n"
               "       vrdmactl device migrate --control PATH --to tcp:IP:PORT [--timeout S]\n"
               "  --control  the vrdmad's control socket (vrdmad --control)\n"
               "  --to       the destination vrdmad (its --incoming address)\n"
               "  --timeout  give up waiting for the end of the migration after S seconds (default 60)\n");
  return 2;
}

Result<nlohmann::json> ask(const std::string& control, const nlohmann::json& req) {
  auto r = control_request(control, req.dump(), 5000);
  if (!r) return std::move(r).error();
  auto j = nlohmann::json::parse(*r, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(Errc::protocol_error, "vrdmad at " + control + " answered something that is not JSON: " + *r);
  return j;
}

std::string phase_of(const nlohmann::json& status) {
  if (status.contains("migration") && status["migration"].is_object() && status["migration"].contains("phase") &&
      status["migration"]["phase"].is_string())
    return status["migration"]["phase"].get<std::string>();
  return "";
}

std::string message_of(const nlohmann::json& status) {
  if (status.contains("migration") && status["migration"].contains("message") &&
      status["migration"]["message"].is_string())
    return status["migration"]["message"].get<std::string>();
  return "";
}

}  // namespace

std::string phase_sentence(const std::string& phase) {
  if (phase == "idle") return "No migration is configured; the device serves its guest here.";
  if (phase == "incoming") return "The device waits for an incoming migration; no state has arrived yet.";
  if (phase == "holding") return "The guest's rings started here before the device state arrived; waiting for it.";
  if (phase == "loaded") return "The device state is loaded here; waiting for the guest's rings to start.";
  if (phase == "armed")
    return "The destination accepted the device; the migration waits for the guest's rings to stop (QEMU's switchover).";
  if (phase == "state-sent") return "The device state was sent; waiting for the destination to load it.";
  if (phase == "handed-over") return "The destination loaded the device state; waiting for it to become active.";
  if (phase == "migrated") return "The device was migrated: the guest runs at the destination.";
  if (phase == "failed") return "The migration failed; the guest keeps running here.";
  if (phase == "in-guest")
    return "The rings stopped during a live migration: the device state is in the guest's memory, which the VMM's last "
           "memory pass carries to the destination.";
  if (phase == "running") return "An incoming migration completed: the guest runs here.";
  return "The device reports an unknown migration phase \"" + phase + "\".";
}

int device_cli(const std::vector<std::string>& args) {
  if (args.empty()) return usage();
  const std::string& cmd = args[0];
  std::string control, to;
  long timeout_s = 60;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const auto& a = args[i];
    if (i + 1 >= args.size()) return usage();
    if (a == "--control") control = args[++i];
    else if (a == "--to") to = args[++i];
    else if (a == "--timeout") {
      if ((timeout_s = std::strtol(args[++i].c_str(), nullptr, 10)) <= 0) return usage();
    } else {
      return usage();
    }
  }
  if (control.empty() || (cmd != "status" && cmd != "migrate") || (cmd == "migrate" && to.empty())) return usage();

  if (cmd == "status") {
    auto st = ask(control, {{"cmd", "status"}});
    if (!st) {
      std::fprintf(stderr, "vrdmactl device: %s\n", st.error().message.c_str());
      return 1;
    }
    const auto phase = phase_of(*st);
    std::printf("%s\n", phase_sentence(phase).c_str());
    if (const auto m = message_of(*st); !m.empty()) std::printf("vrdmad says: %s\n", m.c_str());
    return 0;
  }

  auto r = ask(control, {{"cmd", "migrate"}, {"to", to}});
  if (!r) {
    std::fprintf(stderr, "vrdmactl device: %s\n", r.error().message.c_str());
    return 1;
  }
  if (!r->value("ok", false)) {
    std::fprintf(stderr, "vrdmactl device: vrdmad refused the migration to %s: %s\n", to.c_str(),
                 r->value("error", std::string("no reason given")).c_str());
    return 1;
  }
  std::printf("vrdmad accepted the migration to %s.\n", to.c_str());
  std::fflush(stdout);
  std::string last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    auto st = ask(control, {{"cmd", "status"}});
    if (!st) {
      std::fprintf(stderr, "vrdmactl device: %s\n", st.error().message.c_str());
      return 1;
    }
    const auto phase = phase_of(*st);
    if (phase != last) {
      std::printf("%s\n", phase_sentence(phase).c_str());
      std::fflush(stdout);
      last = phase;
    }
    if (phase == "migrated") return 0;
    if (phase == "failed") {
      std::fprintf(stderr, "vrdmactl device: the migration to %s failed: %s\n", to.c_str(),
                   message_of(*st).empty() ? "vrdmad gave no reason" : message_of(*st).c_str());
      return 1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "vrdmactl device: the migration to %s did not finish within %ld s (phase %s); "
                   "run `vrdmactl device status --control %s` to follow it, or send {\"cmd\":\"cancel\"}.\n",
                   to.c_str(), timeout_s, phase.c_str(), control.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace vrdma::integration
