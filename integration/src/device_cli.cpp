// `vrdmactl device status|migrate`: vrdmad's control socket (one JSON request line, one reply line).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "backend_proc.hpp"
#include "commands.hpp"
#include "vrdma/integration/migrate.hpp"

namespace vrdma::integration {
namespace {

Result<nlohmann::json> ask(const std::string& control, const nlohmann::json& req, int timeout_ms = 5000) {
  return control_json(control, req, timeout_ms);
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
  if (phase == "connecting")
    return "The device is connecting to the destination vrdmad and waits for it to accept the guest.";
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

namespace {

// "objects.pd: 1" lines for every counter of vrdmad's status (the migration has its own sentence).
void print_counters(const nlohmann::json& j, const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (prefix.empty() && it.key() == "migration") continue;
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) print_counters(*it, key);
    else std::printf("  %-28s %s\n", (key + ":").c_str(), it->is_string() ? it->get<std::string>().c_str() : it->dump().c_str());
  }
}

int status(const std::string& control, bool json) {
  auto st = ask(control, {{"cmd", "status"}});
  if (!st) {
    std::fprintf(stderr, "vrdmactl device status: %s\n", st.error().message.c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", st->dump().c_str());
    return 0;
  }
  std::printf("%s\n", phase_sentence(phase_of(*st)).c_str());
  if (const auto m = message_of(*st); !m.empty()) std::printf("vrdmad says: %s\n", m.c_str());
  std::printf("Counters:\n");
  print_counters(*st, "");
  return 0;
}

// With json, the phase sentences go to stderr and stdout gets one object at the end.
int migrate(const std::string& control, const std::string& to, long timeout_s, bool json) {
  std::FILE* say = json ? stderr : stdout;
  auto result = [&](bool ok, const std::string& phase, const std::string& error) {
    if (json) {
      nlohmann::json j{{"ok", ok}, {"to", to}, {"phase", phase}};
      if (!error.empty()) j["error"] = error;
      std::printf("%s\n", j.dump().c_str());
    }
    if (!ok) std::fprintf(stderr, "vrdmactl device migrate: %s\n", error.c_str());
    return ok ? 0 : 1;
  };
  // vrdmad answers once the destination accepted the guest or did not (it waits 5 s at most).
  auto r = ask(control, {{"cmd", "migrate"}, {"to", to}}, 10000);
  if (!r) return result(false, "", r.error().message);
  if (!r->value("ok", false))
    return result(false, "", "vrdmad refused the migration to " + to + ": " +
                                 r->value("error", std::string("no reason given")));
  std::fprintf(say, "vrdmad accepted the migration to %s.\n", to.c_str());
  std::fflush(say);
  std::string last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    auto st = ask(control, {{"cmd", "status"}});
    if (!st) return result(false, last, st.error().message);
    const auto phase = phase_of(*st);
    if (phase != last) {
      std::fprintf(say, "%s\n", phase_sentence(phase).c_str());
      std::fflush(say);
      last = phase;
    }
    if (phase == "migrated") return result(true, phase, "");
    if (phase == "failed")
      return result(false, phase, "the migration to " + to + " failed: " +
                                      (message_of(*st).empty() ? "vrdmad gave no reason" : message_of(*st)));
    if (std::chrono::steady_clock::now() > deadline)
      return result(false, phase, "the migration to " + to + " did not finish within " + std::to_string(timeout_s) +
                                      " s (phase " + phase + "); run `vrdmactl device status --control " + control +
                                      "` to follow it, or send {\"cmd\":\"cancel\"}");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

struct DeviceArgs {
  std::string control, to;
  long timeout_s = 60;
  bool json = false;
};

}  // namespace

void add_device_commands(CLI::App& top, Commands& out) {
  auto* device = top.add_subcommand("device", "a running vrdmad, through its control socket");
  device->require_subcommand(1);
  auto a = std::make_shared<DeviceArgs>();
  auto* st = device->add_subcommand("status", "the device's migration phase and every counter vrdmad keeps");
  st->add_option("--control", a->control, "the vrdmad's control socket (vrdmad --control)")->required();
  st->add_flag("--json", a->json, "vrdmad's status object, as it sent it");
  out.push_back({st, [a] { return status(a->control, a->json); }});
  auto* mig = device->add_subcommand("migrate", "move the device (not the guest) to another vrdmad, and follow it");
  mig->add_option("--control", a->control, "the vrdmad's control socket (vrdmad --control)")->required();
  mig->add_option("--to", a->to, "the destination vrdmad (its --incoming address), tcp:IP:PORT")->required();
  mig->add_option("--timeout", a->timeout_s, "give up waiting after S seconds")
      ->capture_default_str()->check(CLI::Range(1L, 86400L));
  mig->add_flag("--json", a->json, "one JSON object at the end (ok, phase, error); the phases go to stderr");
  out.push_back({mig, [a] { return migrate(a->control, a->to, a->timeout_s, a->json); }});
}

}  // namespace vrdma::integration
