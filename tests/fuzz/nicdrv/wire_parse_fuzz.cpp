// Fuzzes wire::parse() on untrusted UDP payloads (port 4791), with and without ICRC checks,
// and checks that whatever parses re-encodes to the same packet; and wire::run_segment_size(),
// which decides whether a datagram is a segmentation run and where to cut it.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "vrdma/nicdrv/proto/wire.hpp"

namespace w = vrdma::nicdrv::soft::wire;
using w::ParseError;

namespace {

#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) std::abort(); \
  } while (0)

// The context the seed corpus was made with (make_corpus.py): 10.0.0.1 -> 10.0.0.2, id 0, DF.
w::Ipv4Context ctx() {
  w::Ipv4Context ip;
  const std::uint8_t src[4] = {10, 0, 0, 1}, dst[4] = {10, 0, 0, 2};
  std::memcpy(&ip.src_be, src, 4);
  std::memcpy(&ip.dst_be, dst, 4);
  return ip;
}

// Reserved bits the receiver ignores (IBA 9.2: BTH resv6, resv7; 9.3.3: DETH reserved byte).
void mask_reserved(std::vector<std::uint8_t>& v) {
  if (v.size() < w::kBthLen) return;
  std::uint8_t* p = v.data();
  p[4] &= 0xc0;
  p[8] &= 0x80;
  if ((w::opcode_table()[p[0]].flags & w::kHasDeth) && v.size() >= w::kBthLen + w::kDethLen) p[w::kBthLen + 4] = 0;
}

// A parsed packet re-encodes to a packet that parses (with its ICRC) to the same headers and
// payload, and whose bytes equal the input's apart from reserved bits, pad bytes and ICRC.
void check_round_trip(std::span<const std::uint8_t> in, const w::Packet& a) {
  const auto& oi = w::opcode_table()[in[0]];
  FUZZ_CHECK(oi.valid);
  FUZZ_CHECK(a.payload.data() >= in.data() && a.payload.data() + a.payload.size() <= in.data() + in.size());
  FUZZ_CHECK(a.payload.size() <= w::kMaxPayload);
  w::Headers h = a.hdr;
  std::vector<std::uint8_t> out(oi.hdr_len + a.payload.size() + 3 + w::kIcrcLen);
  const std::size_t hl = w::encode_headers(h, a.payload.size(), out);
  FUZZ_CHECK(hl == oi.hdr_len);
  FUZZ_CHECK(h.bth.pad == a.hdr.bth.pad);
  std::copy(a.payload.begin(), a.payload.end(), out.begin() + static_cast<std::ptrdiff_t>(hl));
  const std::size_t total = w::finish_packet(ctx(), out, hl + a.payload.size());
  FUZZ_CHECK(total == in.size());
  out.resize(total);

  w::Packet b;
  FUZZ_CHECK(w::parse(out, ctx(), true, b) == ParseError::none);
  FUZZ_CHECK(b.hdr == a.hdr);
  FUZZ_CHECK(std::equal(b.payload.begin(), b.payload.end(), a.payload.begin(), a.payload.end()));

  std::vector<std::uint8_t> orig(in.begin(), in.end());
  mask_reserved(orig);
  const std::size_t body = hl + a.payload.size();
  FUZZ_CHECK(std::equal(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(body), orig.begin()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Exact-size copy, so any read past the datagram is an ASan error.
  const std::vector<std::uint8_t> buf(data, data + size);
  const std::span<const std::uint8_t> d(buf);
  const w::Ipv4Context ip = ctx();

  w::Packet plain, checked;
  const ParseError e1 = w::parse(d, ip, false, plain);
  const ParseError e2 = w::parse(d, ip, true, checked);
  // Verification only adds bad_icrc on top of the structural checks.
  if (e1 != ParseError::none) FUZZ_CHECK(e2 == e1);
  else FUZZ_CHECK(e2 == ParseError::none || e2 == ParseError::bad_icrc);
  FUZZ_CHECK(!w::to_string(e1).empty());

  if (e1 == ParseError::none) {
    check_round_trip(d, plain);
    if (e2 == ParseError::none) {
      FUZZ_CHECK(checked.hdr == plain.hdr && checked.icrc == plain.icrc);
      FUZZ_CHECK(checked.payload.data() == plain.payload.data() && checked.payload.size() == plain.payload.size());
    }
  }

  // As a segmentation run on a QP whose path MTU the last byte picks: the cut stays inside the
  // datagram, and every segment (an exact-size copy) parses or is refused without overreading.
  if (size > 0) {
    const std::uint32_t pmtu = 256u << (data[size - 1] % 5);
    const std::size_t seg = w::run_segment_size(d, pmtu);
    if (seg != 0) {
      FUZZ_CHECK(seg >= w::kBthLen + w::kIcrcLen && seg < size && size > seg + 3);
      for (std::size_t off = 0; off < size; off += seg) {
        const std::vector<std::uint8_t> one(buf.begin() + static_cast<std::ptrdiff_t>(off),
                                            buf.begin() + static_cast<std::ptrdiff_t>(std::min(size, off + seg)));
        w::Packet s;
        FUZZ_CHECK(!w::to_string(w::parse(one, ip, true, s)).empty());
      }
    }
  }

  // Random bytes almost never carry a right ICRC; give the checked path a fair go by fixing it.
  if (size >= w::kBthLen + w::kIcrcLen) {
    std::vector<std::uint8_t> fixed = buf;
    const std::uint32_t c = w::icrc(ip, std::span(fixed).first(size - w::kIcrcLen));
    for (int i = 0; i < 4; ++i) fixed[size - 4 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(c >> (8 * i));
    w::Packet f;
    FUZZ_CHECK(w::parse(fixed, ip, true, f) == e1);
    if (e1 == ParseError::none) {
      FUZZ_CHECK(f.hdr == plain.hdr && f.icrc == c);
      check_round_trip(fixed, f);
    }
  }
  return 0;
}
