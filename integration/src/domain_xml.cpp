#include "vrdma/integration/domain_xml.hpp"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cstdlib>
#include <memory>

namespace vrdma::integration {
namespace {

struct DocFree {
  void operator()(xmlDoc* d) const noexcept { xmlFreeDoc(d); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

const xmlChar* X(const char* s) { return reinterpret_cast<const xmlChar*>(s); }

Result<Doc> read(const std::string& xml) {
  Doc d(xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "domain.xml", nullptr,
                      XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
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

}  // namespace

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
    char* end = nullptr;
    const unsigned long v = std::strtoul(p.c_str(), &end, 10);
    if (*end != '\0' || v == 0 || v > 65535)
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name +
                                                    " has migration-port \"" + p + "\"; it must be 1..65535");
    m.incoming = "tcp:0.0.0.0:" + std::to_string(v);
  }
  if (!m.incoming.empty()) {
    const auto colon = m.incoming.rfind(':');
    const bool ok = m.incoming.rfind("tcp:", 0) == 0 && colon > 4 && colon + 1 < m.incoming.size() &&
                    m.incoming.find_first_not_of("0123456789", colon + 1) == std::string::npos;
    if (!ok)
      return make_error(Errc::invalid_argument, "the vrdma:device element of domain " + info.name +
                                                    " has incoming \"" + m.incoming + "\"; it must be tcp:IP:PORT");
  }
  if (m.backend == BackendKind::vrdmad) {
    if (m.engine.empty()) return missing("engine");
    if (m.incoming.empty()) return missing("incoming");
    if (m.control.empty()) m.control = sibling_path(m.socket, info.name, ".ctl");
  } else if (m.disk.empty()) {
    return missing("disk");
  }
  info.device = m;
  return info;
}

DeviceMeta for_host(const DomainInfo& dom, const std::string& host) {
  DeviceMeta m = *dom.device;
  m.socket = sibling_path(dom.device->socket, dom.name + "." + host, ".sock");
  if (m.backend == BackendKind::vrdmad) m.control = sibling_path(dom.device->socket, dom.name + "." + host, ".ctl");
  return m;
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

}  // namespace vrdma::integration
