// One frontend connection's state on the backend side (private to vhost/).
#pragma once

#include <array>
#include <functional>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "vrdma/vhost/backend.hpp"
#include "vrdma/vhost/inflight.hpp"

namespace vrdma::vhost {

class BackendSession final : public DeviceHost {
 public:
  // `faults`: where SIGBUS in this frontend's mappings is reported (the server watches it).
  // `fail`: asks the server to drop this frontend with a sentence, later, from the loop (never
  // while this session's code runs).
  BackendSession(Device& dev, EventLoop& loop, const BackendOptions& opts, BackendStats& stats,
                 std::shared_ptr<FaultSink> faults, std::function<void(std::string)> fail);
  ~BackendSession() override;
  // DeviceHost
  [[nodiscard]] GuestView memory() const override { return view(); }
  void run_queue(std::uint16_t index) override;
  [[nodiscard]] bool queue_running(std::uint16_t index) const override;
  void set_queue_notification(std::uint16_t index, bool on) override;
  [[nodiscard]] Result<DescChain> last_avail_chain(std::uint16_t index) const override;
  BackendSession(const BackendSession&) = delete;
  BackendSession& operator=(const BackendSession&) = delete;

  [[nodiscard]] ProtocolFeatures acked_protocol() const { return packed_; }
  // Dispatches one validated message; returns its reply, if the request has one.
  Result<std::optional<Message>> handle(Message& m);

 private:
  using Reply = Result<std::optional<Message>>;
  using Handler = Reply (BackendSession::*)(Message&);
  static const std::array<Handler, static_cast<std::size_t>(Request::count_)> kHandlers;

  struct Vring {
    std::uint16_t num = 0;
    VringAddr addr{};
    bool addr_set = false;
    std::uint32_t base = 0;
    bool enabled = false;
    UniqueFd kick, call, err;
    std::unique_ptr<Ring> ring;  // non-null while started
    RingSetup setup{};           // where the started ring lives
    bool reported_broken = false;
    bool call_full_said = false, err_full_said = false;  // logged that the eventfd refused a write
  };
  // "avail idx A used idx U" as the guest's memory holds them now (split rings), for logs.
  [[nodiscard]] std::string ring_indices(const Vring& v) const;

  // backend_session.cpp: features, owner, memory, log
  Reply get_features(Message& m);
  Reply set_features(Message& m);
  Reply set_owner(Message& m);
  Reply reset_owner(Message& m);
  Reply get_protocol_features(Message& m);
  Reply set_protocol_features(Message& m);
  Reply get_queue_num(Message& m);
  Reply set_mem_table(Message& m);
  Reply get_max_mem_slots(Message& m);
  Reply add_mem_reg(Message& m);
  Reply rem_mem_reg(Message& m);
  Reply set_log_base(Message& m);
  void journal_mem_table() const;  // the new table in the write journal (when one is kept)
  void say_if_unsealed(const MappedRegion& r);
  // backend_vring.cpp: rings
  Reply set_vring_num(Message& m);
  Reply set_vring_addr(Message& m);
  Reply set_vring_base(Message& m);
  Reply get_vring_base(Message& m);
  Reply set_vring_kick(Message& m);
  Reply set_vring_call(Message& m);
  Reply set_vring_err(Message& m);
  Reply set_vring_enable(Message& m);
  // backend_state.cpp: config, inflight, status, device state
  Reply get_config(Message& m);
  Reply set_config(Message& m);
  Reply get_inflight_fd(Message& m);
  Reply set_inflight_fd(Message& m);
  Reply set_status(Message& m);
  Reply get_status(Message& m);
  Reply set_device_state_fd(Message& m);
  Reply check_device_state(Message& m);

  Result<Vring*> vring(std::uint32_t index, std::string_view what);
  [[nodiscard]] GuestView view() const;
  [[nodiscard]] bool protocol_negotiated() const { return acked_.has(VirtioFeature::protocol_features); }
  void try_start(std::uint16_t i);
  void settle_reset();
  void stop(std::uint16_t i);
  void stop_all();
  void process(std::uint16_t i);
  void notify(std::uint16_t i);
  // Signals the call or err eventfd of vring i, never blocking (a full one drops the signal).
  void raise_eventfd(const UniqueFd& fd, std::uint16_t i, bool err);
  void on_state_fd(std::uint32_t events);
  static Message u64_reply(const Message& req, std::uint64_t v);

  Device& dev_;
  EventLoop& loop_;
  BackendOptions opts_;
  BackendStats& stats_;
  std::shared_ptr<FaultSink> faults_;
  std::function<void(std::string)> fail_;
  DeviceInfo info_;
  VirtioFeatures offered_, acked_;
  ProtocolFeatures poffered_, packed_;
  bool protocol_negotiated_ = false;  // SET_PROTOCOL_FEATURES came on this connection
  std::shared_ptr<const GuestMemory> mem_ = GuestMemory::empty();
  std::shared_ptr<DirtyLog> log_;
  std::optional<InflightArea> inflight_;
  std::vector<Vring> vrings_;
  std::uint8_t status_ = 0;
  // SET_STATUS 0 came: the device is reset when ring 0 starts again anywhere but where it
  // stopped (stop_base0_), kept when it carries on from there (backend_state.cpp set_status).
  bool reset_pending_ = false;
  std::uint32_t stop_base0_ = 0;
  // Device-state transfer (SET_DEVICE_STATE_FD / CHECK_DEVICE_STATE).
  UniqueFd state_fd_;
  std::uint32_t state_dir_ = 0;
  std::vector<std::uint8_t> state_buf_;
  std::size_t state_off_ = 0;
  bool state_ok_ = true;
};

}  // namespace vrdma::vhost
