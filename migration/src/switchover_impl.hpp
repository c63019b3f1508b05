// Inside MigratingDevice (switchover.hpp, docs/migration.md): one state machine for both roles
// around the device model, on the backend's event loop. Its parts, one file a role:
//   switchover.cpp              the vhost::Device face: forwards to the device model and moves
//                               the phase on the frontend's ring starts and stops
//   switchover_link.cpp         the link to the peer: framing, sending, reading, losing it
//   switchover_source.cpp       the source: HELLO, the state (over TCP or RDMA, or into guest
//                               memory), letting go
//   switchover_destination.cpp  the destination: accepting a source, loading the state (from the
//                               stream or from guest memory), running the guest here
#pragma once

#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "net.hpp"
#include "rdma_link.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/migration/stream.hpp"
#include "vrdma/migration/switchover.hpp"

namespace vrdma::migration {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
inline std::uint32_t crc32_of(std::span<const std::uint8_t> b) {
  return static_cast<std::uint32_t>(::crc32_z(0, b.data(), b.size()));
}

struct MigratingDevice::Impl {
  device::RdmaDevice& inner;
  vhost::EventLoop& loop;
  MigrationOptions opts;
  DeviceState state;  // the device state codec, state area, re-creation and peer notices
  vhost::DeviceHost* host = nullptr;
  MigrationStatus st;

  UniqueFd listener;
  UniqueFd link;
  FrameReader in;
  std::vector<std::uint8_t> out;
  std::size_t out_off = 0;
  bool link_out_armed = false;

  std::vector<std::uint8_t> pending_state;  // destination: received, not loaded yet
  bool have_state = false;
  bool guest_only = false;      // destination: --incoming guest (no listener)
  bool guest_state_refused = false;
  UniqueFd no_area_timer;       // destination: the frontend may never start the state queue
  Announcer announcer;          // destination: the gratuitous ARPs once the guest runs here
  std::unique_ptr<RdmaLink> rdma;  // the state's RDMA path to the peer, when both have an engine
  Clock::time_point t_stop{}, t_state{};
  bool told_dropping = false;
  std::string arrived_without;  // why the guest runs here without (all) its objects, for the status

  Impl(device::RdmaDevice& d, vhost::EventLoop& l, MigrationOptions o);
  ~Impl();

  // ---- both roles (switchover_link.cpp) ----
  Hello identity() const;
  void drop_link();
  void send(FrameType t, std::span<const std::uint8_t> payload);
  void send(FrameType t, const std::string& text);
  void flush();
  Status watch_link();
  void on_link(std::uint32_t ev);
  void link_lost(const std::string& why);
  void fail(const std::string& why);
  void on_frame(Frame f);  // to the role's own, by the phase

  // ---- destination (switchover_destination.cpp) ----
  // The destination's check of a source's HELLO: a sentence when it cannot take the guest.
  std::optional<std::string> refuse_reason(const Hello& h) const;
  void on_destination_frame(Frame f);
  void accept_source();
  // Destination: the source's state is here (over TCP or RDMA); loaded once the memory is.
  void state_arrived(std::vector<std::uint8_t> blob, const char* via);
  bool have_memory() const { return host != nullptr && !host->memory().memory().regions().empty(); }
  void try_load();
  void activate();
  // Destination, rings started without a state from a source: look in the guest's state area.
  // Returns true when the rings may run (state loaded, or there is definitely none to wait for).
  bool try_guest_state();
  // The guest runs here with no device state. After a restart (the backend before this one
  // died) that means its objects, if it had any, died with that backend: its driver hears it at
  // once (DEVICE_FATAL, kFatalBackendRestarted) instead of waiting on completions that cannot come.
  void runs_without_state(const std::string& why, bool serious);
  // A frontend that runs the device with only the required queues never starts the state
  // queue: after a grace period the guest runs here without a state.
  void arm_no_area_timer();

  // ---- source (switchover_source.cpp) ----
  void on_source_frame(Frame f);
  // Source: every ring stopped while the frontend dirty-logs, and no destination was armed.
  void save_to_guest();
  void send_state();
  void let_go();
  bool others_stopped(std::uint16_t index) const;
  bool all_stopped() const;
  Status migrate_to(const std::string& addr, MigratingDevice::Done done, std::chrono::milliseconds timeout,
                    bool send_layout);
  // Source, Phase::connecting: the connection to the destination while it is being made, on the
  // event loop (a destination that is slow to accept or to answer HELLO costs the loop nothing):
  // connect, HELLO, HELLO_OK; a one-shot timer bounds the whole.
  struct Dial {
    UniqueFd fd, timer;
    sockaddr_in to{};
    std::string addr;
    std::chrono::milliseconds timeout{};
    bool send_layout = true;
    bool hello_sent = false;
    FrameReader in;
    std::unique_ptr<RdmaLink> rdma;
    std::vector<std::uint8_t> hello;
    MigrationStatus before;  // what the status goes back to when the destination is not reached
    MigratingDevice::Done done;
  };
  std::unique_ptr<Dial> dial;
  void on_dial(std::uint32_t ev);
  // The destination accepted (HELLO_OK): the link is the migration's, the phase armed.
  void dialled(const HelloOk& ok);
  // The destination was not reached, refused or did not answer: the status goes back to what
  // it was, and `done` hears why.
  void dial_failed(Error why);
  void drop_dial();
};

}  // namespace vrdma::migration
