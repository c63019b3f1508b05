#include "vrdma/nicdrv/registry.hpp"

#include <string>

#include <fmt/format.h>

#include "providers.hpp"

namespace vrdma::nicdrv {

std::string_view DeviceOptions::get(std::string_view key, std::string_view dflt) const {
  auto it = params.find(key);
  return it == params.end() ? dflt : std::string_view(it->second);
}

bool DeviceOptions::flag(std::string_view key) const {
  auto v = get(key);
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

namespace {
std::vector<Provider>& registry() {
  static std::vector<Provider> all = [] {
    std::vector<Provider> v;
    for (auto* make : detail::kBuiltinProviders) v.push_back(make());
    return v;
  }();
  return all;
}
}  // namespace

const std::vector<Provider>& providers() { return registry(); }

bool add_provider(Provider p) {
  auto& all = registry();
  for (const auto& q : all)
    if (q.prefix == p.prefix) return false;
  all.push_back(std::move(p));
  return true;
}

Result<GidEntry> preferred_gid(const Device& dev, std::uint8_t port) {
  auto t = dev.gid_table(port);
  if (!t) return std::move(t).error();
  if (t->empty()) return make_error(Errc::not_found, fmt::format("{} port {} has an empty GID table", dev.name(), port));
  for (const auto& g : *t)
    if (g.type == GidType::roce_v2 && g.gid.is_ipv4_mapped()) return g;
  return t->front();
}

Result<std::shared_ptr<Device>> open_device(std::string_view name, const DeviceOptions& opts) {
  auto colon = name.find(':');
  if (colon == std::string_view::npos)
    return make_error(Errc::invalid_argument,
                      fmt::format("device name '{}' has no provider prefix; use soft:<ip|ifname> or verbs:<ibdev>", name));
  auto prefix = name.substr(0, colon);
  auto rest = name.substr(colon + 1);
  DeviceOptions merged;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    auto query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    while (!query.empty()) {
      auto amp = query.find('&');
      auto kv = query.substr(0, amp);
      auto eq = kv.find('=');
      // insert_or_assign of whole strings: GCC 12 at -O3 takes `params[k] = "1"` for an
      // overlapping memcpy (-Wrestrict false positive, GCC bug 105329).
      if (eq == std::string_view::npos)
        merged.params.insert_or_assign(std::string(kv), std::string("1"));
      else
        merged.params.insert_or_assign(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
      query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    }
  }
  for (const auto& [k, v] : opts.params) merged.params[k] = v;
  std::string known;
  for (const auto& p : providers()) {
    if (p.prefix == prefix) return p.open(rest, merged);
    known += fmt::format("{}{}", known.empty() ? "" : ", ", p.prefix);
  }
  // fmt rather than "'" + std::string(...) + ...: GCC 12 at -O3 (Release) takes that for an
  // overlapping memcpy (-Wrestrict false positive, GCC bug 105329), and warnings are errors.
  return make_error(Errc::no_device, fmt::format("no provider '{}' in this build (providers: {})", prefix,
                                                 known.empty() ? std::string("none") : known));
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  for (const auto& p : providers())
    if (p.list)
      for (auto& d : p.list()) out.push_back(std::move(d));
  return out;
}

}  // namespace vrdma::nicdrv
