#include "vrdma/integration/domain_xml.hpp"

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <memory>
#include <set>

#include "vrdma/sriov/parse.hpp"
#include "vrdma/virtio_rdma.h"

namespace vrdma::integration {
namespace {

// vrdmad --notices: the guest's RDMA addresses, IPv4 or global IPv6, comma-separated.
bool notice_addresses_ok(const std::string& list) {
  std::size_t at = 0;
  for (;;) {
    const auto comma = list.find(',', at);
    const auto one = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    in_addr v4{};
    in6_addr v6{};
    const bool ok = ::inet_pton(AF_INET, one.c_str(), &v4) == 1 ||
                    (::inet_pton(AF_INET6, one.c_str(), &v6) == 1 && !IN6_IS_ADDR_LINKLOCAL(&v6) &&
                     !IN6_IS_ADDR_LOOPBACK(&v6) && !IN6_IS_ADDR_MULTICAST(&v6) && !IN6_IS_ADDR_UNSPECIFIED(&v6));
    if (!ok) return false;
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}
const char* kNoticesHint = "the guest's RDMA address, IPv4 or global IPv6 (a comma-separated list for both), e.g. "
                           "10.0.0.5 or 10.0.0.5,fd00::5";

struct DocFree {
  void operator()(xmlDoc* d) const noexcept { xmlFreeDoc(d); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

const xmlChar* X(const char* s) { return reinterpret_cast<const xmlChar*>(s); }

// `reindent`: drop whitespace-only text so that a re-serialised document is indented afresh.
Result<Doc> read(const std::string& xml, bool reindent = false) {
  Doc d(xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "domain.xml", nullptr,
                      XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING | (reindent ? XML_PARSE_NOBLANKS : 0)));
  if (!d || !xmlDocGetRootElement(d.get()))
    return make_error(Errc::invalid_argument, "the domain XML does not parse");
  return d;
}

std::string attr(xmlNode* n, const char* name) {
  xmlChar* v = xmlGetProp(n, X(name));
  if (!v) return {};
  std::string s(reinterpret_cast<const char*>(v));
  xmlFree(v);
  return s;
}

xmlNode* child(xmlNode* n, const char* name) {
  for (xmlNode* c = n ? n->children : nullptr; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE && xmlStrEqual(c->name, X(name))) return c;
  return nullptr;
}

xmlNode* vrdma_element(xmlNode* root) {
  xmlNode* meta = child(root, "metadata");
  if (meta == nullptr) return nullptr;
  for (xmlNode* c = meta->children; c; c = c->next)
    if (c->type == XML_ELEMENT_NODE && c->ns && xmlStrEqual(c->ns->href, X(kMetadataNamespace)) &&
        xmlStrEqual(c->name, X("device")))
      return c;
  return nullptr;
}

std::string sibling_path(const std::string& socket, const std::string& base, const char* ext) {
  const auto slash = socket.rfind('/');
  return (slash == std::string::npos ? std::string() : socket.substr(0, slash + 1)) + base + ext;
}

// Every <source path=...> under <devices>, at any depth (disks, interfaces, chardevs).
void replace_paths(xmlNode* n, const std::string& from, const std::string& to) {
  for (xmlNode* c = n ? n->children : nullptr; c; c = c->next) {
    if (c->type != XML_ELEMENT_NODE) continue;
    if (xmlStrEqual(c->name, X("source")) && attr(c, "path") == from) xmlSetProp(c, X("path"), X(to.c_str()));
    replace_paths(c, from, to);
  }
}

bool is_pci_address(const std::string& s) {
  // DDDD:BB:DD.F or BB:DD.F, hex.
  const auto dot = s.rfind('.');
  if (dot == std::string::npos || dot + 2 != s.size() || s.size() > 16) return false;
  int colons = 0;
  for (std::size_t i = 0; i < dot; ++i) {
    if (s[i] == ':') ++colons;
    else if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return (colons == 1 || colons == 2) && std::isdigit(static_cast<unsigned char>(s[dot + 1]));
}

// A Linux netdev name: 1..15 characters, none of them '/', ':' or white space.
bool is_ifname(const std::string& s) {
  if (s.empty() || s.size() > 15 || s == "." || s == "..") return false;
  for (char c : s)
    if (c == '/' || c == ':' || std::isspace(static_cast<unsigned char>(c)) || !std::isprint(static_cast<unsigned char>(c)))
      return false;
  return true;
}

// The vf-* attributes (engine="verbs:vf"). Each bad value is a sentence naming the attribute.
Result<VfRequest> parse_vf_request(xmlNode* e, const std::string& domain) {
  VfRequest r;
  for (const char* name : kVfAttributes) {
    if (!xmlHasProp(e, X(name))) continue;
    const auto v = attr(e, name);
    if (auto st = set_vf_attribute(r, name, v); !st.ok())
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + domain + " has " + name +
                                                    " \"" + v.substr(0, 64) + "\"; it must be " + st.error().message);
  }
  return r;
}

bool has_vf_attributes(xmlNode* e) {
  for (const char* name : kVfAttributes)
    if (xmlHasProp(e, X(name))) return true;
  return false;
}

}  // namespace

Status set_vf_attribute(VfRequest& r, std::string_view name, const std::string& v) {
  auto number = [&](long long lo, long long hi) -> std::optional<long long> {
    if (v.empty() || v.size() > 10 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    const long long n = std::strtoll(v.c_str(), nullptr, 10);
    if (n < lo || n > hi) return std::nullopt;
    return n;
  };
  auto onoff = [&]() -> std::optional<bool> {
    if (v == "on" || v == "yes") return true;
    if (v == "off" || v == "no") return false;
    return std::nullopt;
  };
  auto want = [](const char* what) { return make_error(Errc::invalid_argument, what); };
  if (name == "vf-pool") {
    if (!is_pci_address(v) && !is_ifname(v)) return want("a PF's PCI address (0000:3b:00.0) or its netdev name");
    r.pool = v;
  } else if (name == "vf-numa") {
    const auto n = number(0, 1023);
    if (!n) return want("a NUMA node number, 0..1023");
    r.numa_node = static_cast<int>(*n);
  } else if (name == "vf-vlan") {
    const auto n = number(0, 4094);
    if (!n) return want("a VLAN id, 0..4094 (0: none)");
    r.vlan = static_cast<std::uint16_t>(*n);
  } else if (name == "vf-max-rate") {
    const auto n = number(0, 4294967295LL);
    if (!n) return want("a rate in Mb/s (0: unlimited)");
    r.max_rate_mbps = static_cast<std::uint32_t>(*n);
  } else if (name == "vf-trust" || name == "vf-spoofchk") {
    const auto b = onoff();
    if (!b) return want("on or off");
    (name == "vf-trust" ? r.trust : r.spoofchk) = *b;
  } else {
    return make_error(Errc::not_found, "one of vf-pool, vf-numa, vf-vlan, vf-max-rate, vf-trust, vf-spoofchk");
  }
  return {};
}

bool is_vf_engine(const std::string& engine) { return engine == "verbs:vf" || engine.rfind("verbs:vf?", 0) == 0; }

std::optional<unsigned long> decimal_in(std::string_view text, unsigned long lo, unsigned long hi) {
  unsigned long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

Result<DomainInfo> parse_domain(const std::string& xml) {
  auto doc = read(xml);
  if (!doc) return std::move(doc).error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  if (!xmlStrEqual(root->name, X("domain"))) return make_error(Errc::invalid_argument, "the XML is not a <domain>");
  DomainInfo info;
  if (xmlNode* n = child(root, "name"); n) {
    xmlChar* t = xmlNodeGetContent(n);
    info.name = t ? reinterpret_cast<const char*>(t) : "";
    xmlFree(t);
  }
  xmlNode* e = vrdma_element(root);
  if (!e) return info;
  DeviceMeta m;
  const std::string kind = attr(e, "backend");
  auto missing = [&](const char* what) {
    return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name + " has no " + what +
                                                  " attribute");
  };
  if (kind.empty() || kind == "vrdmad") m.backend = BackendKind::vrdmad;
  else if (kind == "vhost-user-blk") m.backend = BackendKind::vhost_user_blk;
  else
    return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name + " names backend \"" +
                                                  kind + "\"; known backends: vrdmad, vhost-user-blk");
  m.socket = attr(e, "socket");
  if (m.socket.empty() || m.socket[0] != '/') return missing("absolute socket");
  m.control = attr(e, "control");
  m.engine = attr(e, "engine");
  m.mac = attr(e, "mac");
  m.announce = attr(e, "announce");
  m.disk = attr(e, "disk");
  m.incoming = attr(e, "incoming");
  if (const auto p = attr(e, "migration-port"); !p.empty() && m.incoming.empty()) {
    const auto v = decimal_in(p, 1, 65535);
    if (!v)
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name +
                                                    " has migration-port \"" + p + "\"; it must be 1..65535");
    m.incoming = "tcp:0.0.0.0:" + std::to_string(*v);
  }
  if (const auto p = attr(e, "poll-us"); !p.empty()) {
    const auto v = decimal_in(p, 1, 1000000);
    if (!v)
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name + " has poll-us \"" +
                                                    p + "\"; it must be 1..1000000 (microseconds)");
    m.poll_us = static_cast<unsigned>(*v);
  }
  if (const auto p = attr(e, "notices"); !p.empty()) {
    if (!notice_addresses_ok(p))
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name + " has notices \"" + p +
                                                    "\"; it must be " + kNoticesHint);
    m.notices = p;
  }
  if (!m.incoming.empty() && m.incoming != "guest") {
    const auto colon = m.incoming.rfind(':');
    const bool ok = m.incoming.rfind("tcp:", 0) == 0 && colon > 4 && colon + 1 < m.incoming.size() &&
                    m.incoming.find_first_not_of("0123456789", colon + 1) == std::string::npos;
    if (!ok)
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name +
                                                    " has incoming \"" + m.incoming + "\"; it must be tcp:IP:PORT or guest");
  }
  if (m.backend == BackendKind::vrdmad) {
    if (m.engine.empty()) return missing("engine");
    if (is_vf_engine(m.engine)) {
      auto vf = parse_vf_request(e, info.name);
      if (!vf) return std::move(vf).error();
      m.vf = std::move(*vf);
    } else if (has_vf_attributes(e)) {
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name +
                                                    " has vf-* attributes but engine \"" + m.engine +
                                                    "\"; they apply only to engine=\"verbs:vf\" (a VF from the pool)");
    }
    // Without a stream address, a destination takes the device state from the guest's memory.
    if (m.incoming.empty()) m.incoming = "guest";
    if (m.control.empty()) m.control = sibling_path(m.socket, info.name, ".ctl");
  } else if (m.disk.empty()) {
    return missing("disk");
  }
  m.domain = info.name;
  info.device = m;
  return info;
}

DeviceMeta for_host(const DomainInfo& dom, const std::string& host) {
  DeviceMeta m = *dom.device;
  m.socket = sibling_path(dom.device->socket, dom.name + "." + host, ".sock");
  if (m.backend == BackendKind::vrdmad) m.control = sibling_path(dom.device->socket, dom.name + "." + host, ".ctl");
  return m;
}

namespace {

Result<std::string> dump(xmlDoc* doc) {
  xmlChar* out = nullptr;
  int len = 0;
  xmlDocDumpFormatMemory(doc, &out, &len, 1);
  if (!out) return make_error(Errc::no_memory, "cannot serialise the domain XML");
  std::string s(reinterpret_cast<const char*>(out), static_cast<std::size_t>(len));
  xmlFree(out);
  return s;
}

xmlNode* ensure_child(xmlNode* parent, const char* name) {
  if (xmlNode* c = child(parent, name); c) return c;
  return xmlNewChild(parent, nullptr, X(name), nullptr);
}

void set(xmlNode* n, const char* name, const std::string& v) { xmlSetProp(n, X(name), X(v.c_str())); }

}  // namespace

Result<std::string> attach_device(const std::string& xml, const AttachOptions& o) {
  const DeviceMeta& m = o.device;
  if (m.socket.empty() || m.socket[0] != '/')
    return make_error(Errc::invalid_argument, "the device needs an absolute vhost-user socket path (--socket)");
  if (m.engine.empty())
    return make_error(Errc::invalid_argument, "the device needs an engine (--engine soft:IP, verbs:IBDEV or verbs:vf)");
  if (m.vf && !is_vf_engine(m.engine))
    return make_error(Errc::invalid_argument, "VF pool options need the engine verbs:vf (the hook then takes a VF for the "
                                              "backend), not " + m.engine);
  if (!m.notices.empty() && !notice_addresses_ok(m.notices))
    return make_error(Errc::invalid_argument, "--notices " + m.notices + " is not " + kNoticesHint);
  if (const auto why = engine_error(m.engine); !why.empty()) return make_error(Errc::invalid_argument, why);
  if (!m.mac.empty())
    if (auto mac = sriov::parse_mac(m.mac); !mac)
      return make_error(Errc::invalid_argument, "--mac " + m.mac.substr(0, 32) + ": " + mac.error().message);
  auto doc = read(xml, true);
  if (!doc) return std::move(doc).error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  if (!xmlStrEqual(root->name, X("domain"))) return make_error(Errc::invalid_argument, "the XML is not a <domain>");
  std::string name;
  if (xmlNode* n = child(root, "name"); n) {
    xmlChar* t = xmlNodeGetContent(n);
    name = t ? reinterpret_cast<const char*>(t) : "";
    xmlFree(t);
  }
  if (vrdma_element(root))
    return make_error(Errc::invalid_argument, "domain " + name + " already has a vrdma:device element; edit it instead");

  xmlNode* devices = ensure_child(root, "devices");
  std::set<std::string> targets;
  for (xmlNode* d = devices->children; d; d = d->next) {
    if (d->type != XML_ELEMENT_NODE || !xmlStrEqual(d->name, X("disk"))) continue;
    if (xmlNode* s = child(d, "source"); s && attr(s, "path") == m.socket)
      return make_error(Errc::invalid_argument, "a disk of domain " + name + " already uses " + m.socket);
    if (xmlNode* t = child(d, "target"); t) targets.insert(attr(t, "dev"));
  }
  std::string target = o.target;
  if (target.empty()) {
    for (char c = 'a'; c <= 'z' && target.empty(); ++c)
      if (!targets.count(std::string("vd") + c)) target = std::string("vd") + c;
    if (target.empty()) return make_error(Errc::limit_exceeded, "domain " + name + " has no free virtio disk name vda..vdz");
  } else if (targets.count(target)) {
    return make_error(Errc::invalid_argument, "domain " + name + " already has a disk " + target);
  }

  // Shared memfd memory: vhost-user backends map the guest's RAM from the fds QEMU passes.
  xmlNode* mb = ensure_child(root, "memoryBacking");
  if (!child(mb, "hugepages")) set(ensure_child(mb, "source"), "type", "memfd");
  set(ensure_child(mb, "access"), "mode", "shared");

  // The carrier: QEMU's vhost-user-blk-pci passes every queue, the config space and migration
  // through to vrdmad (docs/virtio-rdma.md "Riding vhost-user-blk").
  xmlNode* disk = xmlNewChild(devices, nullptr, X("disk"), nullptr);
  set(disk, "type", "vhostuser");
  set(disk, "device", "disk");
  xmlNode* drv = xmlNewChild(disk, nullptr, X("driver"), nullptr);
  set(drv, "name", "qemu");
  set(drv, "type", "raw");
  set(drv, "queues", std::to_string(o.queues != 0 ? o.queues : VIRTIO_RDMA_NUM_QUEUES));
  set(drv, "queue_size", std::to_string(o.queue_size));
  xmlNode* src = xmlNewChild(disk, nullptr, X("source"), nullptr);
  set(src, "type", "unix");
  set(src, "path", m.socket);
  xmlNode* rec = xmlNewChild(src, nullptr, X("reconnect"), nullptr);
  set(rec, "enabled", "yes");
  set(rec, "timeout", "2");
  xmlNode* tgt = xmlNewChild(disk, nullptr, X("target"), nullptr);
  set(tgt, "dev", target);
  set(tgt, "bus", "virtio");

  // The metadata the hook reads (domain_xml.hpp).
  xmlNode* meta = ensure_child(root, "metadata");
  xmlNode* e = xmlNewChild(meta, nullptr, X("device"), nullptr);
  xmlNs* ns = xmlNewNs(e, X(kMetadataNamespace), X("vrdma"));
  xmlSetNs(e, ns);
  set(e, "backend", "vrdmad");
  set(e, "socket", m.socket);
  set(e, "engine", m.engine);
  if (!m.control.empty()) set(e, "control", m.control);
  if (!m.mac.empty()) set(e, "mac", m.mac);
  if (!m.announce.empty()) set(e, "announce", m.announce);
  if (!m.incoming.empty()) set(e, "incoming", m.incoming);
  if (m.poll_us != 0) set(e, "poll-us", std::to_string(m.poll_us));
  if (!m.notices.empty()) set(e, "notices", m.notices);
  if (m.vf) {
    const VfRequest& v = *m.vf;
    if (!v.pool.empty()) set(e, "vf-pool", v.pool);
    if (v.numa_node) set(e, "vf-numa", std::to_string(*v.numa_node));
    if (v.vlan) set(e, "vf-vlan", std::to_string(*v.vlan));
    if (v.max_rate_mbps) set(e, "vf-max-rate", std::to_string(*v.max_rate_mbps));
    if (v.trust) set(e, "vf-trust", *v.trust ? "on" : "off");
    if (v.spoofchk) set(e, "vf-spoofchk", *v.spoofchk ? "on" : "off");
  }
  auto out = dump(doc->get());
  if (!out) return out;
  // What we wrote must read back as a complete device (the hook's own check).
  auto check = parse_domain(*out);
  if (!check) return std::move(check).error();
  return out;
}

Result<std::string> rewrite_sockets(const std::string& xml, const DeviceMeta& from, const DeviceMeta& to) {
  auto doc = read(xml);
  if (!doc) return std::move(doc).error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  replace_paths(child(root, "devices"), from.socket, to.socket);
  if (xmlNode* e = vrdma_element(root); e) {
    xmlSetProp(e, X("socket"), X(to.socket.c_str()));
    if (!to.control.empty()) xmlSetProp(e, X("control"), X(to.control.c_str()));
  }
  xmlChar* out = nullptr;
  int len = 0;
  xmlDocDumpMemory(doc->get(), &out, &len);
  if (!out) return make_error(Errc::no_memory, "cannot serialise the rewritten domain XML");
  std::string s(reinterpret_cast<const char*>(out), static_cast<std::size_t>(len));
  xmlFree(out);
  return s;
}

std::string engine_error(std::string_view engine) {
  const std::string e(engine.substr(0, 128));
  const char* hint = "an engine is soft:<the guest's IPv4 address or a host interface>, verbs:<an RDMA device or its "
                     "PCI address>, or verbs:vf (a VF from the pool)";
  const auto colon = engine.find(':');
  const std::string_view prefix = engine.substr(0, colon);
  if (colon == std::string_view::npos || (prefix != "soft" && prefix != "verbs"))
    return "'" + e + "' is not an engine: " + hint;
  const std::string_view rest = engine.substr(colon + 1);
  const auto q = rest.find('?');
  const std::string_view spec = rest.substr(0, q);
  if (spec.empty()) return "the engine '" + e + "' names no device: " + hint;
  for (char c : spec)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != ':')
      return "the engine '" + e + "' has a character no device name or address has ('" + std::string(1, c) + "'): " + hint;
  if (prefix == "soft" && spec.find_first_not_of("0123456789.") == std::string_view::npos) {
    in_addr a{};
    if (::inet_pton(AF_INET, std::string(spec).c_str(), &a) != 1)
      return "the engine '" + e + "' does not name an IPv4 address: " + hint;
  }
  if (q != std::string_view::npos) {
    std::string_view opts = rest.substr(q + 1);
    while (true) {
      const auto amp = opts.find('&');
      const std::string_view kv = opts.substr(0, amp);
      const auto eq = kv.find('=');
      if (eq == 0 || eq == std::string_view::npos || eq + 1 == kv.size())
        return "the engine option '" + std::string(kv.substr(0, 64)) + "' is not key=value (e.g. soft:10.0.0.5?mtu=1024)";
      if (amp == std::string_view::npos) break;
      opts = opts.substr(amp + 1);
    }
  }
  return "";
}

Result<std::string> detach_device(const std::string& xml) {
  auto doc = read(xml);
  if (!doc) return std::move(doc).error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  if (!xmlStrEqual(root->name, X("domain"))) return make_error(Errc::invalid_argument, "the XML is not a <domain>");
  xmlNode* e = vrdma_element(root);
  if (e == nullptr)
    return make_error(Errc::not_found, "the domain has no vrdma:device element, so there is nothing to detach");
  const std::string socket = attr(e, "socket");
  if (xmlNode* devices = child(root, "devices"); devices && !socket.empty()) {
    for (xmlNode* d = devices->children; d;) {
      xmlNode* next = d->next;
      if (d->type == XML_ELEMENT_NODE && xmlStrEqual(d->name, X("disk")))
        if (xmlNode* s = child(d, "source"); s && attr(s, "path") == socket) {
          xmlUnlinkNode(d);
          xmlFreeNode(d);
        }
      d = next;
    }
  }
  xmlUnlinkNode(e);
  xmlFreeNode(e);
  return dump(doc->get());
}

namespace {

std::string node_xml(xmlDoc* doc, xmlNode* n) {
  xmlBuffer* b = xmlBufferCreate();
  if (b == nullptr) return {};
  xmlNodeDump(b, doc, n, 0, 0);
  std::string s(reinterpret_cast<const char*>(xmlBufferContent(b)), static_cast<std::size_t>(xmlBufferLength(b)));
  xmlBufferFree(b);
  return s;
}

// The disk whose source is `socket`, or null.
xmlNode* carrier_disk(xmlNode* root, const std::string& socket) {
  xmlNode* devices = child(root, "devices");
  for (xmlNode* d = devices ? devices->children : nullptr; d; d = d->next)
    if (d->type == XML_ELEMENT_NODE && xmlStrEqual(d->name, X("disk")))
      if (xmlNode* s = child(d, "source"); s && attr(s, "path") == socket) return d;
  return nullptr;
}

// The parts of `xml` (a domain with the device) libvirt takes for a running domain.
Result<LiveDevice> parts_of(const std::string& xml) {
  auto info = parse_domain(xml);
  if (!info) return std::move(info).error();
  if (!info->device)
    return make_error(Errc::not_found, "domain " + info->name + " has no vrdma device (no vrdma:device metadata)");
  auto doc = read(xml);
  if (!doc) return std::move(doc).error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  xmlNode* disk = carrier_disk(root, info->device->socket);
  if (disk == nullptr)
    return make_error(Errc::not_found, "domain " + info->name + " has vrdma:device metadata but no disk on its socket " +
                                           info->device->socket);
  LiveDevice out;
  out.disk = node_xml(doc->get(), disk);
  // libvirt puts the element into the namespace it is given: the element goes without its own.
  xmlNode* e = xmlCopyNode(vrdma_element(root), 1);
  if (e == nullptr) return make_error(Errc::no_memory, "cannot copy the vrdma:device element");
  xmlSetNs(e, nullptr);
  for (xmlNs* ns = e->nsDef; ns != nullptr;) {  // its xmlns:vrdma declaration
    xmlNs* next = ns->next;
    xmlFreeNs(ns);
    ns = next;
  }
  e->nsDef = nullptr;
  out.metadata = node_xml(doc->get(), e);
  xmlFreeNode(e);
  out.device = *info->device;
  return out;
}

}  // namespace

Result<LiveDevice> live_attach_parts(const std::string& live_xml, const AttachOptions& o) {
  auto doc = read(live_xml);
  if (!doc) return std::move(doc).error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  xmlNode* mb = child(root, "memoryBacking");
  const bool shared = mb && attr(child(mb, "access"), "mode") == "shared" &&
                      (attr(child(mb, "source"), "type") == "memfd" || child(mb, "hugepages") != nullptr);
  if (!shared)
    return make_error(Errc::bad_state,
                      "the running domain's memory is not shared (memoryBacking with a memfd source or hugepages and "
                      "access mode='shared'), and vhost-user devices need it from boot: add the device to the "
                      "domain's XML (vrdmactl domain attach --xml) and start it again, or give the domain shared "
                      "memory so that the device can be hot-plugged later");
  auto attached = attach_device(live_xml, o);
  if (!attached) return std::move(attached).error();
  return parts_of(*attached);
}

Result<LiveDevice> live_detach_parts(const std::string& live_xml) { return parts_of(live_xml); }

bool has_carrier_disk(const std::string& xml, const std::string& socket) {
  auto doc = read(xml);
  return doc && carrier_disk(xmlDocGetRootElement(doc->get()), socket) != nullptr;
}

}  // namespace vrdma::integration
