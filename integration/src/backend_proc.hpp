// Starting, finding and stopping a guest's backend process (vrdmad or the vhost-user-blk
// fixture) for the libvirt hook. The hook runs and exits; the backend outlives it, detached
// (its own session, stdio on a log file), with its pid in <socket>.pid and its log in
// <socket>.log.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/integration/domain_xml.hpp"

namespace vrdma::integration {

struct BackendPrograms {
  std::string vrdmad;          // $VRDMA_VRDMAD, else vrdmad next to this executable or in ../sbin
  std::string vhost_user_blk;  // $VRDMA_BLK_BACKEND, else vhost_blk_backend next to this executable
  // The group QEMU runs as, for vrdmad --socket-group: $VRDMA_QEMU_GROUP ("none": no group), else
  // the `group = "..."` of libvirt's qemu.conf ($VRDMA_QEMU_CONF, default /etc/libvirt/qemu.conf),
  // else libvirt-qemu when that group exists (Debian's default), else "".
  std::string qemu_group;
  static BackendPrograms from_environment();
};

// The `group = "..."` setting of a libvirt qemu.conf ("" when the file or the setting is absent).
std::string qemu_conf_group(const std::string& path);

// The backend's pid if it runs (pid file present, process alive and serving m.socket), else 0.
int backend_pid(const DeviceMeta& m);

// Starts the backend for m unless it already runs; incoming makes vrdmad a migration
// destination on m.incoming. Returns once the vhost-user socket exists (and,
// for vrdmad, the control socket answers), or with the backend's own last log line.
Status ensure_backend(const DeviceMeta& m, bool incoming, const BackendPrograms& progs);

// SIGTERM (SIGKILL after 5 s), then removes the sockets and the pid file. No error if it
// does not run.
Status stop_backend(const DeviceMeta& m);

// The libvirt hook's start and stop of a domain's device backend on `host` (hook.cpp), also what
// `vrdmactl domain attach|detach --live` does. Start: unless one already serves the socket; with
// engine="verbs:vf" a VF of the pool first (given back when starting fails). Returns what to add
// to a log line, or the failure as a whole sentence. Stop: the backend, then its VF back to the
// pool; the failure to give the VF back is a sentence.
Result<std::string> start_device_backend(const std::string& domain, const std::string& host, const DeviceMeta& m,
                                         bool incoming, bool migrating, const BackendPrograms& progs);
struct StoppedBackend {
  std::string vf;       // the VF given back to the pool, if the device had one
  std::string warning;  // what the pool said about it (e.g. a setting it could not reset)
  [[nodiscard]] std::string log_part() const;  // ", released VF X (warning)" or ""
};
Result<StoppedBackend> stop_device_backend(const std::string& domain, const std::string& host, const DeviceMeta& dev);

// One request line to a vrdmad control socket, one JSON line back (timeout_ms for both).
Result<std::string> control_request(const std::string& path, const std::string& line, int timeout_ms = 2000);
// The same with the answer parsed: a JSON object, or a protocol_error naming what came back.
Result<nlohmann::json> control_json(const std::string& path, const nlohmann::json& request, int timeout_ms);

}  // namespace vrdma::integration
