// The switchover stream between a source and a destination vrdmad (docs/migration.md): framed
// messages over one TCP connection. Every frame is a 16-byte header (magic "VRMG", version,
// type, payload length) and a payload whose size is bounded per type. The destination reads
// bytes from the network, so FrameReader checks every header before buffering a payload, and
// decode_hello() checks every field; both are fuzzed (tests/fuzz/migration).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"

namespace vrdma::migration {

inline constexpr std::uint32_t kStreamMagic = 0x474d5256;  // "VRMG" little-endian
inline constexpr std::uint16_t kStreamVersion = 1;
inline constexpr std::size_t kHeaderSize = 16;
inline constexpr std::uint32_t kMaxStateBytes = 64u << 20;  // a device state larger than this is refused
inline constexpr std::uint32_t kMaxTextBytes = 4096;        // hellos and sentences

enum class FrameType : std::uint16_t {
  hello = 1,     // source -> destination: the guest's identity (JSON, see Hello)
  hello_ok = 2,  // destination -> source: identity accepted, waiting for the state
  refuse = 3,    // destination -> source: identity refused (a sentence)
  state = 4,     // source -> destination: the device state blob (DeviceState::save_state)
  loaded = 5,    // destination -> source: state loaded (JSON: load time)
  reject = 6,    // destination -> source: state rejected (a sentence)
  active = 7,    // destination -> source: the guest runs here now; let go of it
  abort = 8,     // source -> destination: the guest runs on at the source; discard the state
  prestate = 9,  // source -> destination, after HELLO_OK: the object layout (DeviceState::save_layout)
                 // to build ahead during pre-copy; no answer
  state_written = 10,  // source -> destination: the device state is in the buffer HELLO_OK exposed,
                       // written over RDMA (JSON: StateWritten); instead of STATE
};
[[nodiscard]] const char* to_string(FrameType t) noexcept;

struct Frame {
  FrameType type{};
  std::vector<std::uint8_t> payload;
  [[nodiscard]] std::string text() const { return {payload.begin(), payload.end()}; }
};

// Header + payload, ready to write.
std::vector<std::uint8_t> encode(FrameType type, std::span<const std::uint8_t> payload);
std::vector<std::uint8_t> encode(FrameType type, const std::string& text);

// Incremental reader: feed() what the socket gave, then take frames with next(). After an
// error the stream is unusable (the connection must be closed).
class FrameReader {
 public:
  void feed(std::span<const std::uint8_t> bytes);
  // A complete frame, nullopt when more bytes are needed, or an error for a malformed header.
  Result<std::optional<Frame>> next();
  [[nodiscard]] std::size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::vector<std::uint8_t> buf_;
  std::size_t pos_ = 0;
};

// The guest's identity as the source states it; the destination must present the same one.
// One side's RC QP for the state over RDMA (HELLO and HELLO_OK carry it as "rdma").
struct RdmaPeer {
  std::string gid;          // the migration engine's GID, e.g. "::ffff:10.67.0.1"
  std::uint32_t qpn = 0;    // 24 bits
  std::uint32_t psn = 0;    // 24 bits: the first PSN this side sends
  std::uint64_t addr = 0;   // destination: the buffer the state goes into
  std::uint32_t rkey = 0;   // destination
  std::uint64_t bytes = 0;  // destination: the buffer's size (at most kMaxStateBytes); 0: none
  friend bool operator==(const RdmaPeer&, const RdmaPeer&) = default;
};

struct Hello {
  std::string gid;            // the engine's GID 0, e.g. "::ffff:10.66.0.1"
  std::string mac;            // the device's MAC, "52:54:00:66:00:01"
  std::string engine;         // the engine's provider ("soft", "verbs")
  std::uint32_t state_version = 0;  // the device-state format version the blob will have
  std::string source;         // who sends (host name and control socket), for log lines
  std::optional<RdmaPeer> rdma;    // the source has a migration engine: its QP
  std::uint64_t state_hint = 0;    // the source's estimate of the state's size (bytes)
  std::string release;        // the source's vrdma release ("0.1.0"); empty from releases before it
};
// A peer's release for a sentence: the release, or "before 0.1.0" when it sent none.
std::string release_name(const std::string& release);
std::string encode_hello(const Hello& h);
Result<Hello> decode_hello(std::span<const std::uint8_t> payload);

struct HelloOk {
  bool prestate = false;          // this destination builds the objects ahead from PRESTATE
  std::optional<RdmaPeer> rdma;   // its QP and state buffer, when the state may come over RDMA
  std::string release;            // the destination's vrdma release; empty from releases before it
};
std::string encode_hello_ok(const HelloOk& h);
Result<HelloOk> decode_hello_ok(std::span<const std::uint8_t> payload);

struct StateWritten {
  std::uint64_t bytes = 0;   // how much of the buffer holds the state
  std::uint32_t crc32 = 0;   // zlib CRC-32 of those bytes
};
std::string encode_state_written(const StateWritten& s);
Result<StateWritten> decode_state_written(std::span<const std::uint8_t> payload);

}  // namespace vrdma::migration
