// The vrdma element in a libvirt domain's <metadata> and the rewrites the hook does on it.
//
//   <metadata>
//     <vrdma:device xmlns:vrdma="https://vrdma.dev/xmlns/1"
//                   backend="vrdmad" socket="/run/vrdma/g1.sock" control="/run/vrdma/g1.ctl"
//                   engine="soft:10.0.0.5" mac="52:54:00:12:34:56" announce="eth0"
//                   incoming="tcp:0.0.0.0:7811"/>
//   </metadata>
//
// engine="verbs:vf" (or "verbs:vf?OPTIONS") asks the hook for a VF of this host's SR-IOV pool
// (guest_vf.hpp): it takes one through the VF ledger, configures it, and starts vrdmad on the
// VF's RDMA device. Optional attributes for it: vf-pool (the PF: PCI address or netdev; default
// any PF), vf-numa (a NUMA node), vf-vlan (0..4094), vf-max-rate (Mb/s, 0 = unlimited),
// vf-trust and vf-spoofchk (on|off). The VF's MAC is the element's mac.
//
// backend is "vrdmad" (the default: the virtio RDMA device; engine required; mac, announce,
// control and incoming optional: incoming="tcp:IP:PORT" makes a destination also accept the
// state streamed from the source vrdmad, migration-port="P" is short for incoming="tcp:0.0.0.0:P";
// without it incoming is "guest": the state comes in the guest's own memory; poll-us="N" runs
// vrdmad with --poll-us N, its latency mode: polling for N µs after the last work instead of
// sleeping on the guest's kicks, 1..1000000), or "vhost-user-blk"
// (the test fixture backend; disk). socket is the vhost-user
// socket that the domain's device (e.g. <disk type='vhostuser'>) names as its source path.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vrdma/common/result.hpp"

namespace vrdma::integration {

inline constexpr const char* kMetadataNamespace = "https://vrdma.dev/xmlns/1";

enum class BackendKind { vrdmad, vhost_user_blk };

// What engine="verbs:vf" asks of the host's VF pool (vf-* attributes).
struct VfRequest {
  std::string pool;                             // vf-pool: the PF, PCI address or netdev ("": any PF)
  std::optional<int> numa_node;                 // vf-numa
  std::optional<std::uint16_t> vlan;            // vf-vlan, 0..4094
  std::optional<std::uint32_t> max_rate_mbps;   // vf-max-rate, 0 = unlimited
  std::optional<bool> trust;                    // vf-trust
  std::optional<bool> spoofchk;                 // vf-spoofchk
  bool operator==(const VfRequest&) const = default;
};

inline constexpr std::array<const char*, 6> kVfAttributes = {"vf-pool",     "vf-numa",  "vf-vlan",
                                                             "vf-max-rate", "vf-trust", "vf-spoofchk"};

// Sets one vf-* attribute (a name of kVfAttributes) from its text, for the element and for
// `vrdmactl domain attach --vf-*`. Errors: invalid_argument with what the value must be
// ("a VLAN id, 0..4094 (0: none)"); not_found when the name is not a vf-* attribute.
Status set_vf_attribute(VfRequest& r, std::string_view name, const std::string& value);

// True for the engine that asks for a VF: "verbs:vf" or "verbs:vf?OPTIONS".
bool is_vf_engine(const std::string& engine);

struct DeviceMeta {
  BackendKind backend = BackendKind::vrdmad;
  std::string socket;          // vhost-user socket (required)
  std::string control;         // vrdmad control socket (default: socket with ".ctl")
  std::string engine;          // vrdmad --engine (required for vrdmad)
  std::string mac;             // vrdmad --mac (optional)
  std::string announce;        // vrdmad --announce (optional)
  std::string incoming;        // vrdmad --incoming on a destination: tcp:IP:PORT, or "guest" (the default)
  unsigned poll_us = 0;        // vrdmad --poll-us (0: vrdmad sleeps on the guest's kicks)
  std::string notices;         // vrdmad --notices: the guest's addresses (IPv4/IPv6, comma-separated) for peer notices on a NIC
  std::string disk;            // vhost-user-blk --disk (required for vhost-user-blk)
  std::optional<VfRequest> vf; // set exactly when engine is verbs:vf
  std::string domain;          // the domain's name (parse_domain sets it): vrdmad --domain, for status and logs
};

struct DomainInfo {
  std::string name;
  std::optional<DeviceMeta> device;  // empty: not a vrdma domain (the hook leaves it alone)
};

// `text` as a whole decimal number in lo..hi; nothing when it is empty, signed, has other
// characters or is out of range (attribute and option values).
std::optional<unsigned long> decimal_in(std::string_view text, unsigned long lo, unsigned long hi);

// Parses a domain XML. Errors: the XML does not parse, or the vrdma element is incomplete
// (the sentence names the missing attribute).
Result<DomainInfo> parse_domain(const std::string& xml);

// The per-host names of a migrating guest's sockets: <dir of socket>/<domain>.<host>.sock (and
// .ctl), so that two hosts sharing a folder (and a host receiving its guest back) never collide.
DeviceMeta for_host(const DomainInfo& dom, const std::string& host);

// The domain XML with every device source path equal to from.socket replaced by to.socket and
// the vrdma element's socket and control updated. Error when the XML does not parse.
Result<std::string> rewrite_sockets(const std::string& xml, const DeviceMeta& from, const DeviceMeta& to);

// What `vrdmactl domain attach` adds to a domain.
struct AttachOptions {
  DeviceMeta device;                 // socket, engine (required); mac, announce, control, incoming, poll_us (optional)
  std::uint16_t queues = 0;          // the device's virtqueues (0: the virtio RDMA device's count)
  std::uint16_t queue_size = 256;
  std::string target;                // guest disk name for the carrier ("vdb"); empty: the first free vdX
};

// The domain XML with the virtio RDMA device attached the way stock QEMU can carry it
// (docs/integration.md "Attaching the device"): a <disk type='vhostuser'> on the vrdmad socket
// (QEMU's vhost-user-blk-pci, queues and queue_size set), shared memfd memory (vhost-user needs
// the guest's RAM as shared fds; an existing hugepages backing is kept and made shared), and the
// vrdma:device metadata the hook reads (with the vf-* attributes when device.vf is set; the
// engine must then be verbs:vf). Errors: the XML does not parse or is not a domain, it
// already has a vrdma:device, a disk already uses the socket or the requested target, or the
// options lack socket/engine.
Result<std::string> attach_device(const std::string& xml, const AttachOptions& opts);

// "" when `engine` is a well-formed vrdmad engine name (soft:<IPv4 | ifname>, verbs:<ibdev |
// PCI address>, verbs:vf, each with ?key=value&... options); otherwise the sentence saying why.
// The engine itself opens on the host that runs the guest: this checks only its form.
std::string engine_error(std::string_view engine);

// The domain XML without the virtio RDMA device: the vrdma:device element and the disk on its
// socket go; the shared memory backing stays (other vhost-user devices may need it). Errors:
// the XML does not parse, or it has no vrdma:device.
Result<std::string> detach_device(const std::string& xml);

// Hot-plug (vrdmactl domain attach/detach --live): the pieces libvirt takes for a running domain.
struct LiveDevice {
  std::string disk;      // the carrier's <disk type='vhostuser'> element, for virDomainAttach/DetachDeviceFlags
  std::string metadata;  // the <device .../> element without its namespace, for virDomainSetMetadata
  DeviceMeta device;     // what the backend is started (or stopped) with
};

// From a running domain's XML: the device attach_device would add. Errors as attach_device's,
// and when the domain's memory is not shared (vhost-user needs memfd or hugepages with
// access='shared' from boot: libvirt cannot change that on a running domain).
Result<LiveDevice> live_attach_parts(const std::string& live_xml, const AttachOptions& opts);

// From a running domain's XML: its vrdma device (the disk element and the metadata). Error when
// the domain has none.
Result<LiveDevice> live_detach_parts(const std::string& live_xml);

// Whether the domain XML has a disk on vhost-user socket `socket` (false when it does not parse).
bool has_carrier_disk(const std::string& xml, const std::string& socket);

}  // namespace vrdma::integration
