// CM MAD encode and parse. Field positions from IBA vol 1 tables 106-113 (REQ, MRA, REJ, REP,
// RTU, DREQ, DREP): byte offsets into the MAD data, bit 0 = the byte's most significant bit.
#include "vrdma/nicdrv/proto/mad.hpp"

#include <algorithm>
#include <cstring>

namespace vrdma::nicdrv::soft::mad {
namespace {

// REQ (table 106)
namespace req {
constexpr Field local_comm_id{0, 0, 32}, service_id{8, 0, 64}, local_ca_guid{16, 0, 64}, local_qkey{28, 0, 32},
    local_qpn{32, 0, 24}, responder_resources{35, 0, 8}, local_eecn{36, 0, 24}, initiator_depth{39, 0, 8},
    remote_eecn{40, 0, 24}, remote_cm_response_timeout{43, 0, 5}, transport_service_type{43, 5, 2},
    end_to_end_flow_control{43, 7, 1}, starting_psn{44, 0, 24}, local_cm_response_timeout{47, 0, 5},
    retry_count{47, 5, 3}, pkey{48, 0, 16}, path_mtu{50, 0, 4}, rdc_exists{50, 4, 1}, rnr_retry_count{50, 5, 3},
    max_cm_retries{51, 0, 4}, srq{51, 4, 1}, extended_transport_type{51, 5, 3}, primary_local_lid{52, 0, 16},
    primary_remote_lid{54, 0, 16}, primary_flow_label{88, 0, 20}, primary_packet_rate{91, 2, 6},
    primary_traffic_class{92, 0, 8}, primary_hop_limit{93, 0, 8}, primary_sl{94, 0, 4},
    primary_subnet_local{94, 4, 1}, primary_local_ack_timeout{95, 0, 5};
constexpr std::size_t primary_local_gid = 56, primary_remote_gid = 72, alternate = 96, private_data = 140;
}  // namespace req
// MRA (table 107)
namespace mra {
constexpr Field local_comm_id{0, 0, 32}, remote_comm_id{4, 0, 32}, message_mraed{8, 0, 2}, service_timeout{9, 0, 5};
constexpr std::size_t private_data = 10;
}  // namespace mra
// REJ (table 108)
namespace rej {
constexpr Field local_comm_id{0, 0, 32}, remote_comm_id{4, 0, 32}, message_rejected{8, 0, 2},
    reject_info_length{9, 0, 7}, reason{10, 0, 16};
constexpr std::size_t ari = 12, private_data = 84;
}  // namespace rej
// REP (table 110)
namespace rep {
constexpr Field local_comm_id{0, 0, 32}, remote_comm_id{4, 0, 32}, local_qkey{8, 0, 32}, local_qpn{12, 0, 24},
    local_eecn{16, 0, 24}, starting_psn{20, 0, 24}, responder_resources{24, 0, 8}, initiator_depth{25, 0, 8},
    target_ack_delay{26, 0, 5}, failover_accepted{26, 5, 2}, end_to_end_flow_control{26, 7, 1},
    rnr_retry_count{27, 0, 3}, srq{27, 3, 1}, local_ca_guid{28, 0, 64};
constexpr std::size_t private_data = 36;
}  // namespace rep
// RTU, DREQ, DREP (tables 111-113)
namespace rtu {
constexpr Field local_comm_id{0, 0, 32}, remote_comm_id{4, 0, 32};
constexpr std::size_t private_data = 8;
}  // namespace rtu
namespace dreq {
constexpr Field local_comm_id{0, 0, 32}, remote_comm_id{4, 0, 32}, remote_qpn{8, 0, 24};
constexpr std::size_t private_data = 12;
}  // namespace dreq

static_assert(fits(req::primary_local_ack_timeout) && fits(req::service_id) && fits(rep::local_ca_guid));
static_assert(req::alternate + 44 == req::private_data && req::primary_remote_gid + 16 == req::primary_flow_label.byte);
static_assert(rej::ari + 72 == rej::private_data);
constexpr const AttrInfo& info_of(Attr a) {
  for (const auto& i : kCmAttrs)
    if (i.id == a) return i;
  return kCmAttrs[0];
}
static_assert(info_of(Attr::req).private_off == req::private_data && info_of(Attr::mra).private_off == mra::private_data &&
              info_of(Attr::rej).private_off == rej::private_data && info_of(Attr::rep).private_off == rep::private_data &&
              info_of(Attr::rtu).private_off == rtu::private_data && info_of(Attr::dreq).private_off == dreq::private_data &&
              info_of(Attr::drep).private_off == rtu::private_data);
static_assert(sizeof(Req{}.private_data) == info_of(Attr::req).private_len &&
              sizeof(Mra{}.private_data) == info_of(Attr::mra).private_len &&
              sizeof(Rej{}.private_data) == info_of(Attr::rej).private_len &&
              sizeof(Rep{}.private_data) == info_of(Attr::rep).private_len &&
              sizeof(Rtu{}.private_data) == info_of(Attr::rtu).private_len &&
              sizeof(Dreq{}.private_data) == info_of(Attr::dreq).private_len &&
              sizeof(Drep{}.private_data) == info_of(Attr::drep).private_len);

using Data = std::span<std::uint8_t, kDataLen>;
using CData = std::span<const std::uint8_t, kDataLen>;

template <std::size_t N>
void put_bytes(Data d, std::size_t off, const std::array<std::uint8_t, N>& a) {
  std::memcpy(d.data() + off, a.data(), N);
}
template <std::size_t N>
void get_bytes(CData d, std::size_t off, std::array<std::uint8_t, N>& a) {
  std::memcpy(a.data(), d.data() + off, N);
}

void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
std::uint16_t get16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }

void encode_msg(Data d, const Req& m) {
  put(d, req::local_comm_id, m.local_comm_id);
  put(d, req::service_id, m.service_id);
  put(d, req::local_ca_guid, m.local_ca_guid);
  put(d, req::local_qkey, m.local_qkey);
  put(d, req::local_qpn, m.local_qpn);
  put(d, req::responder_resources, m.responder_resources);
  put(d, req::local_eecn, m.local_eecn);
  put(d, req::initiator_depth, m.initiator_depth);
  put(d, req::remote_eecn, m.remote_eecn);
  put(d, req::remote_cm_response_timeout, m.remote_cm_response_timeout);
  put(d, req::transport_service_type, m.transport_service_type);
  put(d, req::end_to_end_flow_control, m.end_to_end_flow_control);
  put(d, req::starting_psn, m.starting_psn);
  put(d, req::local_cm_response_timeout, m.local_cm_response_timeout);
  put(d, req::retry_count, m.retry_count);
  put(d, req::pkey, m.pkey);
  put(d, req::path_mtu, m.path_mtu);
  put(d, req::rdc_exists, m.rdc_exists);
  put(d, req::rnr_retry_count, m.rnr_retry_count);
  put(d, req::max_cm_retries, m.max_cm_retries);
  put(d, req::srq, m.srq);
  put(d, req::extended_transport_type, m.extended_transport_type);
  put(d, req::primary_local_lid, m.primary_local_lid);
  put(d, req::primary_remote_lid, m.primary_remote_lid);
  put_bytes(d, req::primary_local_gid, m.primary_local_gid);
  put_bytes(d, req::primary_remote_gid, m.primary_remote_gid);
  put(d, req::primary_flow_label, m.primary_flow_label);
  put(d, req::primary_packet_rate, m.primary_packet_rate);
  put(d, req::primary_traffic_class, m.primary_traffic_class);
  put(d, req::primary_hop_limit, m.primary_hop_limit);
  put(d, req::primary_sl, m.primary_sl);
  put(d, req::primary_subnet_local, m.primary_subnet_local);
  put(d, req::primary_local_ack_timeout, m.primary_local_ack_timeout);
  put_bytes(d, req::alternate, m.alternate);
  put_bytes(d, req::private_data, m.private_data);
}
void decode_msg(CData d, Req& m) {
  m.local_comm_id = static_cast<std::uint32_t>(get(d, req::local_comm_id));
  m.service_id = get(d, req::service_id);
  m.local_ca_guid = get(d, req::local_ca_guid);
  m.local_qkey = static_cast<std::uint32_t>(get(d, req::local_qkey));
  m.local_qpn = static_cast<std::uint32_t>(get(d, req::local_qpn));
  m.responder_resources = static_cast<std::uint8_t>(get(d, req::responder_resources));
  m.local_eecn = static_cast<std::uint32_t>(get(d, req::local_eecn));
  m.initiator_depth = static_cast<std::uint8_t>(get(d, req::initiator_depth));
  m.remote_eecn = static_cast<std::uint32_t>(get(d, req::remote_eecn));
  m.remote_cm_response_timeout = static_cast<std::uint8_t>(get(d, req::remote_cm_response_timeout));
  m.transport_service_type = static_cast<std::uint8_t>(get(d, req::transport_service_type));
  m.end_to_end_flow_control = get(d, req::end_to_end_flow_control) != 0;
  m.starting_psn = static_cast<std::uint32_t>(get(d, req::starting_psn));
  m.local_cm_response_timeout = static_cast<std::uint8_t>(get(d, req::local_cm_response_timeout));
  m.retry_count = static_cast<std::uint8_t>(get(d, req::retry_count));
  m.pkey = static_cast<std::uint16_t>(get(d, req::pkey));
  m.path_mtu = static_cast<std::uint8_t>(get(d, req::path_mtu));
  m.rdc_exists = get(d, req::rdc_exists) != 0;
  m.rnr_retry_count = static_cast<std::uint8_t>(get(d, req::rnr_retry_count));
  m.max_cm_retries = static_cast<std::uint8_t>(get(d, req::max_cm_retries));
  m.srq = get(d, req::srq) != 0;
  m.extended_transport_type = static_cast<std::uint8_t>(get(d, req::extended_transport_type));
  m.primary_local_lid = static_cast<std::uint16_t>(get(d, req::primary_local_lid));
  m.primary_remote_lid = static_cast<std::uint16_t>(get(d, req::primary_remote_lid));
  get_bytes(d, req::primary_local_gid, m.primary_local_gid);
  get_bytes(d, req::primary_remote_gid, m.primary_remote_gid);
  m.primary_flow_label = static_cast<std::uint32_t>(get(d, req::primary_flow_label));
  m.primary_packet_rate = static_cast<std::uint8_t>(get(d, req::primary_packet_rate));
  m.primary_traffic_class = static_cast<std::uint8_t>(get(d, req::primary_traffic_class));
  m.primary_hop_limit = static_cast<std::uint8_t>(get(d, req::primary_hop_limit));
  m.primary_sl = static_cast<std::uint8_t>(get(d, req::primary_sl));
  m.primary_subnet_local = get(d, req::primary_subnet_local) != 0;
  m.primary_local_ack_timeout = static_cast<std::uint8_t>(get(d, req::primary_local_ack_timeout));
  get_bytes(d, req::alternate, m.alternate);
  get_bytes(d, req::private_data, m.private_data);
}

void encode_msg(Data d, const Mra& m) {
  put(d, mra::local_comm_id, m.local_comm_id);
  put(d, mra::remote_comm_id, m.remote_comm_id);
  put(d, mra::message_mraed, m.message_mraed);
  put(d, mra::service_timeout, m.service_timeout);
  put_bytes(d, mra::private_data, m.private_data);
}
void decode_msg(CData d, Mra& m) {
  m.local_comm_id = static_cast<std::uint32_t>(get(d, mra::local_comm_id));
  m.remote_comm_id = static_cast<std::uint32_t>(get(d, mra::remote_comm_id));
  m.message_mraed = static_cast<std::uint8_t>(get(d, mra::message_mraed));
  m.service_timeout = static_cast<std::uint8_t>(get(d, mra::service_timeout));
  get_bytes(d, mra::private_data, m.private_data);
}

void encode_msg(Data d, const Rej& m) {
  put(d, rej::local_comm_id, m.local_comm_id);
  put(d, rej::remote_comm_id, m.remote_comm_id);
  put(d, rej::message_rejected, m.message_rejected);
  put(d, rej::reject_info_length, m.reject_info_length);
  put(d, rej::reason, m.reason);
  put_bytes(d, rej::ari, m.ari);
  put_bytes(d, rej::private_data, m.private_data);
}
void decode_msg(CData d, Rej& m) {
  m.local_comm_id = static_cast<std::uint32_t>(get(d, rej::local_comm_id));
  m.remote_comm_id = static_cast<std::uint32_t>(get(d, rej::remote_comm_id));
  m.message_rejected = static_cast<std::uint8_t>(get(d, rej::message_rejected));
  m.reject_info_length = static_cast<std::uint8_t>(get(d, rej::reject_info_length));
  m.reason = static_cast<std::uint16_t>(get(d, rej::reason));
  get_bytes(d, rej::ari, m.ari);
  get_bytes(d, rej::private_data, m.private_data);
}

void encode_msg(Data d, const Rep& m) {
  put(d, rep::local_comm_id, m.local_comm_id);
  put(d, rep::remote_comm_id, m.remote_comm_id);
  put(d, rep::local_qkey, m.local_qkey);
  put(d, rep::local_qpn, m.local_qpn);
  put(d, rep::local_eecn, m.local_eecn);
  put(d, rep::starting_psn, m.starting_psn);
  put(d, rep::responder_resources, m.responder_resources);
  put(d, rep::initiator_depth, m.initiator_depth);
  put(d, rep::target_ack_delay, m.target_ack_delay);
  put(d, rep::failover_accepted, m.failover_accepted);
  put(d, rep::end_to_end_flow_control, m.end_to_end_flow_control);
  put(d, rep::rnr_retry_count, m.rnr_retry_count);
  put(d, rep::srq, m.srq);
  put(d, rep::local_ca_guid, m.local_ca_guid);
  put_bytes(d, rep::private_data, m.private_data);
}
void decode_msg(CData d, Rep& m) {
  m.local_comm_id = static_cast<std::uint32_t>(get(d, rep::local_comm_id));
  m.remote_comm_id = static_cast<std::uint32_t>(get(d, rep::remote_comm_id));
  m.local_qkey = static_cast<std::uint32_t>(get(d, rep::local_qkey));
  m.local_qpn = static_cast<std::uint32_t>(get(d, rep::local_qpn));
  m.local_eecn = static_cast<std::uint32_t>(get(d, rep::local_eecn));
  m.starting_psn = static_cast<std::uint32_t>(get(d, rep::starting_psn));
  m.responder_resources = static_cast<std::uint8_t>(get(d, rep::responder_resources));
  m.initiator_depth = static_cast<std::uint8_t>(get(d, rep::initiator_depth));
  m.target_ack_delay = static_cast<std::uint8_t>(get(d, rep::target_ack_delay));
  m.failover_accepted = static_cast<std::uint8_t>(get(d, rep::failover_accepted));
  m.end_to_end_flow_control = get(d, rep::end_to_end_flow_control) != 0;
  m.rnr_retry_count = static_cast<std::uint8_t>(get(d, rep::rnr_retry_count));
  m.srq = get(d, rep::srq) != 0;
  m.local_ca_guid = get(d, rep::local_ca_guid);
  get_bytes(d, rep::private_data, m.private_data);
}

template <class M>  // RTU and DREP share one layout
void encode_ids(Data d, const M& m) {
  put(d, rtu::local_comm_id, m.local_comm_id);
  put(d, rtu::remote_comm_id, m.remote_comm_id);
  put_bytes(d, rtu::private_data, m.private_data);
}
template <class M>
void decode_ids(CData d, M& m) {
  m.local_comm_id = static_cast<std::uint32_t>(get(d, rtu::local_comm_id));
  m.remote_comm_id = static_cast<std::uint32_t>(get(d, rtu::remote_comm_id));
  get_bytes(d, rtu::private_data, m.private_data);
}
void encode_msg(Data d, const Rtu& m) { encode_ids(d, m); }
void decode_msg(CData d, Rtu& m) { decode_ids(d, m); }
void encode_msg(Data d, const Drep& m) { encode_ids(d, m); }
void decode_msg(CData d, Drep& m) { decode_ids(d, m); }

void encode_msg(Data d, const Dreq& m) {
  put(d, dreq::local_comm_id, m.local_comm_id);
  put(d, dreq::remote_comm_id, m.remote_comm_id);
  put(d, dreq::remote_qpn, m.remote_qpn);
  put_bytes(d, dreq::private_data, m.private_data);
}
void decode_msg(CData d, Dreq& m) {
  m.local_comm_id = static_cast<std::uint32_t>(get(d, dreq::local_comm_id));
  m.remote_comm_id = static_cast<std::uint32_t>(get(d, dreq::remote_comm_id));
  m.remote_qpn = static_cast<std::uint32_t>(get(d, dreq::remote_qpn));
  get_bytes(d, dreq::private_data, m.private_data);
}

}  // namespace

// A field touches at most 9 bytes; every field of more than 57 bits starts on a byte boundary
// (checked in get/put), so a 64-bit window over the touched bytes always holds it.
std::uint64_t get(std::span<const std::uint8_t, kDataLen> data, Field f) noexcept {
  if (!fits(f)) return 0;
  const unsigned first = f.byte, last = (f.byte * 8u + f.bit + f.width - 1) / 8u;
  const unsigned total = (last - first + 1) * 8;
  if (total > 64) return 0;  // unaligned and over 57 bits: no such IBA field
  std::uint64_t w = 0;
  for (unsigned i = first; i <= last; ++i) w = (w << 8) | data[i];
  const unsigned shift = total - f.bit - f.width;
  const std::uint64_t mask = f.width == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << f.width) - 1;
  return (w >> shift) & mask;
}

void put(std::span<std::uint8_t, kDataLen> data, Field f, std::uint64_t v) noexcept {
  if (!fits(f)) return;
  const unsigned first = f.byte, last = (f.byte * 8u + f.bit + f.width - 1) / 8u;
  const unsigned total = (last - first + 1) * 8;
  if (total > 64) return;
  std::uint64_t w = 0;
  for (unsigned i = first; i <= last; ++i) w = (w << 8) | data[i];
  const unsigned shift = total - f.bit - f.width;
  const std::uint64_t ones = f.width == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << f.width) - 1;
  const std::uint64_t mask = ones << shift;
  w = (w & ~mask) | ((v << shift) & mask);
  for (unsigned i = last + 1; i-- > first;) {
    data[i] = static_cast<std::uint8_t>(w);
    w >>= 8;
  }
}

const AttrInfo* attr_info(std::uint16_t id) noexcept {
  for (const auto& a : kCmAttrs)
    if (static_cast<std::uint16_t>(a.id) == id) return &a;
  return nullptr;
}

Attr attr_of(const Message& m) noexcept {
  static constexpr Attr ids[] = {Attr::req, Attr::mra, Attr::rej, Attr::rep, Attr::rtu, Attr::dreq, Attr::drep};
  static_assert(std::size(ids) == std::variant_size_v<Message>);
  return ids[m.index()];
}

MadBytes encode(Header hdr, const Message& msg) noexcept {
  MadBytes b{};
  hdr.attr_id = static_cast<std::uint16_t>(attr_of(msg));
  b[0] = hdr.base_version;
  b[1] = hdr.mgmt_class;
  b[2] = hdr.class_version;
  b[3] = hdr.method;
  put16(&b[4], hdr.status);
  put16(&b[6], hdr.class_specific);
  for (int i = 0; i < 8; ++i) b[8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(hdr.tid >> (56 - 8 * i));
  put16(&b[16], hdr.attr_id);
  // bytes 18..19 reserved
  for (int i = 0; i < 4; ++i) b[20 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(hdr.attr_mod >> (24 - 8 * i));
  Data d(b.data() + kHdrLen, kDataLen);
  std::visit([&](const auto& m) { encode_msg(d, m); }, msg);
  return b;
}

ParseError parse_header(std::span<const std::uint8_t> mad, Header& h) noexcept {
  if (mad.size() != kMadLen) return ParseError::bad_length;
  h.base_version = mad[0];
  h.mgmt_class = mad[1];
  h.class_version = mad[2];
  h.method = mad[3];
  h.status = get16(&mad[4]);
  h.class_specific = get16(&mad[6]);
  h.tid = 0;
  for (int i = 0; i < 8; ++i) h.tid = (h.tid << 8) | mad[8 + static_cast<std::size_t>(i)];
  h.attr_id = get16(&mad[16]);
  h.attr_mod = 0;
  for (int i = 0; i < 4; ++i) h.attr_mod = (h.attr_mod << 8) | mad[20 + static_cast<std::size_t>(i)];
  if (h.base_version != kBaseVersion) return ParseError::bad_base_version;
  if (h.mgmt_class != kClassCm) return ParseError::not_cm;
  if (h.class_version != kCmClassVersion) return ParseError::bad_class_version;
  if (h.method != kMethodSend) return ParseError::bad_method;
  return ParseError::none;
}

ParseError parse(std::span<const std::uint8_t> mad, Mad& out) noexcept {
  if (auto e = parse_header(mad, out.hdr); e != ParseError::none) return e;
  const AttrInfo* ai = attr_info(out.hdr.attr_id);
  if (ai == nullptr) return ParseError::unknown_attribute;
  if (!ai->handled) return ParseError::unhandled_attribute;
  CData d(mad.data() + kHdrLen, kDataLen);
  switch (ai->id) {
    case Attr::req: out.msg.emplace<Req>(); break;
    case Attr::mra: out.msg.emplace<Mra>(); break;
    case Attr::rej: out.msg.emplace<Rej>(); break;
    case Attr::rep: out.msg.emplace<Rep>(); break;
    case Attr::rtu: out.msg.emplace<Rtu>(); break;
    case Attr::dreq: out.msg.emplace<Dreq>(); break;
    case Attr::drep: out.msg.emplace<Drep>(); break;
    default: return ParseError::unhandled_attribute;
  }
  std::visit([&](auto& m) { decode_msg(d, m); }, out.msg);
  return ParseError::none;
}

std::string_view to_string(ParseError e) noexcept {
  switch (e) {
    case ParseError::none: return "ok";
    case ParseError::bad_length: return "a GSI MAD is 256 bytes";
    case ParseError::bad_base_version: return "MAD base version is not 1";
    case ParseError::not_cm: return "not a Communication Management MAD";
    case ParseError::bad_class_version: return "CM class version is not 2";
    case ParseError::bad_method: return "CM MAD method is not Send";
    case ParseError::unknown_attribute: return "unknown CM attribute";
    case ParseError::unhandled_attribute: return "CM attribute not supported (LAP, APR, SIDR)";
  }
  return "?";
}

std::string_view to_string(RejReason r) noexcept {
  switch (r) {
    case RejReason::no_qp: return "no QP available";
    case RejReason::no_resources: return "no resources";
    case RejReason::timeout: return "timeout";
    case RejReason::unsupported: return "unsupported request";
    case RejReason::invalid_comm_id: return "invalid communication ID";
    case RejReason::invalid_comm_instance: return "invalid communication instance";
    case RejReason::invalid_service_id: return "invalid service ID (nobody listens on that port)";
    case RejReason::invalid_transport_type: return "invalid transport service type";
    case RejReason::stale_connection: return "stale connection";
    case RejReason::invalid_gid: return "primary remote port GID rejected";
    case RejReason::invalid_mtu: return "invalid path MTU";
    case RejReason::insufficient_resp_resources: return "insufficient responder resources";
    case RejReason::consumer: return "rejected by the application";
    case RejReason::invalid_rnr_retry: return "invalid RNR retry count";
    case RejReason::duplicate_local_comm_id: return "duplicate local communication ID";
    case RejReason::invalid_class_version: return "invalid class version";
  }
  return "";
}

void encode_cma(const CmaHeader& h, std::span<std::uint8_t> out) noexcept {
  if (out.size() < kCmaHdrLen) return;
  std::fill(out.begin(), out.begin() + kCmaHdrLen, 0);
  out[0] = h.version;
  out[1] = static_cast<std::uint8_t>(h.ip_version << 4);
  put16(&out[2], h.src_port);
  std::memcpy(&out[4 + 12], &h.src_ip_be, 4);
  std::memcpy(&out[20 + 12], &h.dst_ip_be, 4);
}

std::optional<CmaHeader> parse_cma(std::span<const std::uint8_t> in) noexcept {
  if (in.size() < kCmaHdrLen) return std::nullopt;
  CmaHeader h;
  h.version = in[0];
  h.ip_version = static_cast<std::uint8_t>(in[1] >> 4);
  if (h.version != 0 || h.ip_version != 4) return std::nullopt;
  h.src_port = get16(&in[2]);
  std::memcpy(&h.src_ip_be, &in[4 + 12], 4);
  std::memcpy(&h.dst_ip_be, &in[20 + 12], 4);
  return h;
}

}  // namespace vrdma::nicdrv::soft::mad
