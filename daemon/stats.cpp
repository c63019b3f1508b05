// vrdmad's statistics and status as JSON (the control socket's "stats" and "status", the exit
// line): stats.hpp.
#include "stats.hpp"

#include <fstream>
#include <optional>

#include "vrdma/common/version.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::vrdmad {

nlohmann::json migration_json(const migration::MigratingDevice& mig) {
  const auto m = mig.status();
  return {{"phase", migration::to_string(m.phase)}, {"peer", m.peer},           {"message", m.message},
          {"state_bytes", m.state_bytes},          {"save_ms", m.save_ms},     {"load_ms", m.load_ms},
          {"stop_to_active_ms", m.stop_to_active_ms}, {"garps", m.garps}, {"state_via", m.state_via}};
}

// What the engine put on and took off the wire: the soft engine's own counters; a NIC's port
// counters from sysfs (the data counters count 4-byte words, IBA 16.1.3.5); {} when neither.
nlohmann::json wire_json(const nicdrv::Device& engine, const std::string& name) {
  if (auto st = nicdrv::soft::stats(engine))
    return {{"tx_packets", st->tx_packets},
            {"rx_packets", st->rx_packets},
            {"tx_bytes", st->tx_bytes},
            {"rx_bytes", st->rx_bytes},
            {"retransmits", st->retransmits},
            {"timeouts", st->timeouts},
            {"read_rereads", st->read_rereads},
            {"rnr_naks_sent", st->rnr_naks_sent},
            {"rnr_naks_received", st->rnr_naks_received},
            {"seq_naks_sent", st->seq_naks_sent},
            {"seq_naks_received", st->seq_naks_received},
            {"duplicates_received", st->duplicates_received},
            {"remote_invalidations", st->remote_invalidations},
            {"local_invalidations", st->local_invalidations},
            {"fast_registrations", st->fast_registrations},
            {"rx_dropped_no_recv", st->rx_dropped_no_recv},
            {"rx_dropped", st->rx_dropped_icrc + st->rx_dropped_malformed + st->rx_dropped_no_qp + st->rx_dropped_qkey +
                               st->rx_dropped_pkey + st->rx_longer_than_mtu + st->rx_dropped_no_recv}};
  if (name.rfind("verbs:", 0) != 0) return nlohmann::json::object();
  const auto options = name.find('?');  // verbs:IBDEV[?OPTIONS]
  const std::string ibdev = name.substr(6, options == std::string::npos ? std::string::npos : options - 6);
  const std::string dir = "/sys/class/infiniband/" + ibdev + "/ports/1/counters/";
  auto counter = [&](const char* file) -> std::optional<std::uint64_t> {
    std::ifstream in(dir + file);
    std::uint64_t v = 0;
    if (in >> v) return v;
    return std::nullopt;
  };
  nlohmann::json j = nlohmann::json::object();
  if (auto v = counter("port_xmit_packets")) j["tx_packets"] = *v;
  if (auto v = counter("port_rcv_packets")) j["rx_packets"] = *v;
  if (auto v = counter("port_xmit_data")) j["tx_bytes"] = *v * 4;
  if (auto v = counter("port_rcv_data")) j["rx_bytes"] = *v * 4;
  return j;
}

nlohmann::json stats_json(const device::RdmaDevice& dev, const migration::MigratingDevice& mig,
                          const vhost::BackendServer& srv, const std::string& engine, const nicdrv::Device& wire,
                          const std::string& domain, const std::string& socket) {
  const auto s = dev.stats();
  const auto& ds = mig.device_state();
  const auto m = ds.stats();
  const auto& b = srv.stats();
  return {
      {"version", std::string(vrdma::version())},
      {"domain", domain},
      {"socket", socket},
      {"migration", migration_json(mig)},
      {"engine", engine},
      {"connected", srv.connected()},
      {"paused", s.paused},
      {"state_area_bytes", ds.state_area_bytes()},
      {"objects", {{"pd", s.pds}, {"mr", s.mrs}, {"cq", s.cqs}, {"qp", s.qps}, {"ah", s.ahs}, {"srq", s.srqs}, {"db_ring", s.db_rings}}},
      {"registered_bytes", s.registered_bytes},
      {"precreated", m.precreated},
      {"adopted", m.adopted},
      {"commands", s.commands},
      {"command_errors", s.command_errors},
      {"doorbells", s.doorbells},
      {"doorbell_errors", s.doorbell_errors},
      {"ring_doorbells", s.ring_doorbells},
      {"send_wqes", s.send_wqes},
      {"recv_wqes", s.recv_wqes},
      {"wqe_errors", s.wqe_errors},
      {"cqes", s.cqes},
      {"cq_overruns", s.cq_overruns},
      {"events", s.events},
      {"events_dropped", s.events_dropped},
      {"notices",
       {{"peers_paused", m.peers_paused},
        {"peers_repointed", m.peers_repointed},
        {"answered", m.notices_answered},
        {"refused", m.notices_refused},
        {"qps_paused", m.qps_paused},
        {"qps_repointed", m.qps_repointed}}},
      {"vhost", {{"connections", b.connections}, {"messages", b.messages}, {"rejected", b.rejected}, {"kicks", b.kicks}}},
      {"wire", wire_json(wire, engine)},
  };
}

}  // namespace vrdma::vrdmad
