// Live migration of a virtio RDMA device between two vrdmad processes (docs/migration.md).
//
// MigratingDevice wraps the device model (device::RdmaDevice) as a vhost::Device and runs the
// switchover protocol of stream.hpp around it. The state itself (the codec, the object layout
// built ahead, the state area in guest memory) is its DeviceState's (device_state.hpp), which
// reads the device through its snapshot interface; this wrapper decides when each is used and
// talks to the peer:
//
//   source                                         destination (vrdmad --incoming tcp:IP:PORT)
//   migrate_to(addr): connect, HELLO  ---------->  identity checked (GID, MAC, engine, version)
//                                     <----------  HELLO_OK (or REFUSE + sentence)
//                                     ---------->  PRESTATE: the object layout; the engine
//                                                  objects are built now (when HELLO_OK said so)
//   ... the guest runs; the frontend (QEMU) dirty-logs and copies memory ...
//   every ring stopped (GET_VRING_BASE): the engine is quiesced at a consistent point
//   save_state(), STATE              ---------->  kept until the guest memory table arrives,
//                                                  then load_state()
//                                     <----------  LOADED (or REJECT + sentence)
//                                                  rings start (the guest runs here): announce
//                                                  the guest's address (gratuitous ARP), the
//                                                  engine resumes, peers see retransmissions
//                                     <----------  ACTIVE
//   let go: objects destroyed without a packet, address silenced (NOARP)
//
// The state can also travel without this stream, inside the guest's memory: a source whose
// rings all stop while the frontend dirty-logs (a live migration it was not told about) writes
// the state into the guest's state area (DeviceState::save_state_to_guest); a destination whose
// rings start without a state from a source reads it from there. The source lets go when its
// frontend disconnects after such a stop (the VMM quits once the guest runs elsewhere).
//
// Which side runs is decided by the frontend (QEMU), never by this stream: a source whose rings
// start again after sending its state (the migration failed) sends ABORT and carries on with
// nothing lost; a destination never runs rings without a loaded state (it holds them, and says
// so in the log, until the state arrives).
//
// Threads: everything runs on the backend's event loop, like every vhost::Device call, and
// nothing blocks it: migrate_to() connects and waits for HELLO_OK on the loop (Phase::connecting).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "vrdma/common/result.hpp"
#include "vrdma/migration/device_state.hpp"
#include "vrdma/vhost/event_loop.hpp"
#include "vrdma/device/rdma_device.hpp"

namespace vrdma::migration {

enum class Phase {
  idle,          // no migration configured
  connecting,    // source: connecting to the destination, waiting for it to accept (HELLO_OK)
  incoming,      // destination: listening, no state yet
  holding,       // destination: rings started before the state arrived; waiting for it
  loaded,        // destination: state loaded, waiting for the rings to start
  armed,         // source: destination accepted the identity; waiting for the rings to stop
  state_sent,    // source: state sent, waiting for LOADED
  handed_over,   // source: the destination loaded the state; waiting for ACTIVE
  migrated,      // source: the guest runs at the destination; this device is done
  failed,        // source: the migration failed (why in status().message); the guest runs on here
  running,       // destination: the guest runs here (an incoming migration completed)
  in_guest,      // source: every ring stopped while the frontend dirty-logs: the state went into the
                 // guest's state area; the frontend's last memory pass carries it
};
[[nodiscard]] const char* to_string(Phase p) noexcept;

struct MigrationOptions {
  std::string engine_name;   // e.g. "soft:10.66.0.1" (its provider prefix goes into HELLO)
  std::string mac;           // the guest device's MAC, "aa:bb:cc:dd:ee:ff"
  // The interface that carries the guest's address on this host (soft engine). When set, the
  // destination keeps it silent (NOARP) until the guest runs here, then announces the address
  // with gratuitous ARPs; the source silences it after the hand-over.
  std::string announce_if;
  std::string self;          // who we are, for the peer's log lines
  // This backend replaces one that died (vrdmad --supervise restarted it): when the guest's
  // memory holds no state to take its objects from, its driver is told they are gone.
  bool restarted = false;
  // An RDMA engine on the migration network (vrdmad --migration-engine): when both sides have
  // one, the device state goes over it (an RDMA WRITE into the destination's buffer), else TCP.
  std::shared_ptr<nicdrv::Device> migration_engine;
  // The device state's own options (drain time on a NIC, peer notices).
  DeviceStateOptions device;
};

struct MigrationStatus {
  Phase phase = Phase::idle;
  std::string peer;             // the other vrdmad (address)
  std::string message;          // last sentence (why a migration failed, what we wait for)
  std::uint64_t state_bytes = 0;
  double save_ms = 0;           // rings stopped -> state captured
  double load_ms = 0;           // destination: state received -> loaded
  double stop_to_active_ms = 0; // source: last ring stopped -> ACTIVE received
  std::uint32_t garps = 0;      // gratuitous ARPs sent
  std::string state_via;        // how the last state went or came: "rdma", "tcp" (empty: none yet)
};

class MigratingDevice final : public vhost::Device {
 public:
  MigratingDevice(device::RdmaDevice& inner, vhost::EventLoop& loop, MigrationOptions opts);
  ~MigratingDevice() override;
  MigratingDevice(const MigratingDevice&) = delete;
  MigratingDevice& operator=(const MigratingDevice&) = delete;

  // Destination: accept the state of a guest from a source vrdmad at "tcp:IP:PORT", or with
  // "guest" only from the guest's own memory (the state area, which a destination always reads
  // when its rings start before a source sent the state).
  Status listen_incoming(const std::string& addr);
  // Source: start a migration to the destination vrdmad at "tcp:IP:PORT". Returns at once: an
  // error says why none could start (a bad address, the wrong phase, an immediate refusal),
  // and `done` is then never called. Otherwise the phase is `connecting` while the connection
  // is made and HELLO answered, on the event loop, and `done` is called once, on the loop: ok
  // when the destination accepted the guest's identity (phase armed), or why not (refused, no
  // answer within `timeout`, cancelled; the status is then back to what it was). Unless
  // `prestate` is false, the object layout goes as soon as it is accepted (PRESTATE) so that
  // the destination builds the engine objects during pre-copy; the state goes when every ring
  // has stopped.
  using Done = std::function<void(Status)>;
  Status migrate_to(const std::string& addr, Done done, std::chrono::milliseconds timeout = std::chrono::seconds(5),
                    bool prestate = true);
  // Source: give up a migration still connecting, or armed (before the state has gone).
  Status cancel(const std::string& why);
  [[nodiscard]] MigrationStatus status() const;

  // vhost::Device: forwarded to the device model, with the switchover protocol around it.
  [[nodiscard]] vhost::DeviceInfo info() const override;
  [[nodiscard]] std::vector<std::uint8_t> config() const override;
  Status write_config(std::uint32_t offset, std::span<const std::uint8_t> data) override;
  void features_acked(vhost::VirtioFeatures acked) override;
  void attach(vhost::DeviceHost* host) override;
  void memory_changed() override;
  void queue_ready(vhost::Queue& q) override;
  void queue_stopped(std::uint16_t index) override;
  void reset() override;
  Result<std::vector<std::uint8_t>> save_state() override;
  Status load_state(std::span<const std::uint8_t> blob) override;

  // The device's state and what moves it (peer notices, the state area's figures).
  [[nodiscard]] DeviceState& device_state();
  [[nodiscard]] const DeviceState& device_state() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace vrdma::migration
