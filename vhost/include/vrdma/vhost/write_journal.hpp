// The write journal (debug): a record of every write this process makes into guest memory,
// with the moments its rings stopped and started and its dirty logging turned on and off, and
// where the device's objects lie in guest memory. A test that compares a migrated guest's
// memory with its source's (tests/tools/vrdma_memcmp.cpp) reads it to tell whether a page that
// differs is one the backend wrote, when, and whether the dirty log carried it
// (docs/vhost.md "The write journal").
//
// Off unless the environment names a file: VRDMA_WRITE_JOURNAL=PATH ("%p" in PATH becomes the
// process id, so that every backend process of a test writes its own). Off, each call costs one
// load of a pointer set once. On, records are buffered and written out at every stop (no ring
// running any more), when the buffer fills, and at exit; a write made while no ring runs is
// written through at once, since it is the one a comparison looks for.
//
// Threads: any thread may call (the engine's thread reports its writes into registered memory).
#pragma once

#include <cstdint>

namespace vrdma::vhost::journal {

enum class Type : std::uint8_t { write = 1, event = 2, object = 3 };

// Who wrote: through GuestView (rings, completions, the state area, command responses) or the
// RDMA engine placing data into a registered region.
enum class Source : std::uint8_t { backend = 1, engine = 2 };

enum class Event : std::uint8_t {
  opened = 1,        // the journal's first record; gpa: the process id
  ring_started = 2,  // id: the ring
  ring_stopped = 3,  // id: the ring (GET_VRING_BASE, a new kick fd, a disconnect)
  logging_on = 4,    // LOG_ALL acked with a dirty log in place
  logging_off = 5,
  log_base = 6,      // a new dirty log; len: its size in bytes
  mem_region = 7,    // a region of the guest memory table: gpa, len (size), aux (offset in its fd)
  mem_table = 8,     // a new table follows (mem_region records); id: its number of regions
};

// What a range of guest memory holds for the device (reported at every stop, and for vrings at
// every start). id: the object's handle (or the ring index); aux: which part.
enum class Object : std::uint8_t {
  vring = 1,       // aux 0 descriptor table, 1 driver (avail) area, 2 device (used) area
  cq_ring = 2,
  send_ring = 3,
  recv_ring = 4,
  srq_ring = 5,
  qp_status = 6,   // a QP's or SRQ's status block
  mr_page = 7,     // one page of a memory region the engine may write
  state_area = 8,  // one buffer of the state area chain
};

// Write flags.
inline constexpr std::uint8_t kLogging = 1;    // the dirty log was on for this write
inline constexpr std::uint8_t kLogged = 2;     // every page of it was marked in the dirty log
inline constexpr std::uint8_t kAfterStop = 4;  // no ring ran (after the frontend stopped them all)

struct Record {  // 40 bytes, host byte order; the file is a plain array of them
  std::uint64_t t_ns;  // CLOCK_REALTIME, comparable between the processes of one host
  std::uint64_t gpa;
  std::uint64_t len;
  std::uint64_t aux;
  std::uint8_t type;   // Type
  std::uint8_t kind;   // Source, Event or Object
  std::uint8_t flags;  // writes: kLogging | kLogged | kAfterStop
  std::uint8_t pad;
  std::uint32_t id;
};
static_assert(sizeof(Record) == 40);

// True when this process keeps a journal.
[[nodiscard]] bool enabled() noexcept;

// `logging`: the dirty log was on; `logged`: every page was marked in it.
void write(std::uint64_t gpa, std::uint64_t len, Source src, bool logging, bool logged) noexcept;
void event(Event e, std::uint32_t id = 0, std::uint64_t gpa = 0, std::uint64_t len = 0, std::uint64_t aux = 0) noexcept;
void object(Object o, std::uint32_t id, std::uint64_t gpa, std::uint64_t len, std::uint64_t aux = 0) noexcept;
// Rings: the stop state that writes are flagged with (kAfterStop once none runs).
void ring_started(std::uint16_t index) noexcept;
void ring_stopped(std::uint16_t index) noexcept;
void flush() noexcept;

}  // namespace vrdma::vhost::journal
