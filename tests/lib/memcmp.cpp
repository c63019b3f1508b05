#include "memcmp.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "vrdma/common/fd.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::test::memcmp {
namespace j = vrdma::vhost::journal;
namespace {

constexpr char kQemuMemfd[] = "/memfd:memory-backend-memfd";

struct Region {
  std::uint64_t gpa, size, offset;
};

struct Object {
  j::Object kind;
  std::uint32_t id;
  std::uint64_t gpa, len, aux;
  auto key() const { return std::tie(kind, id, gpa, len, aux); }
  bool operator<(const Object& o) const { return key() < o.key(); }
};

struct Writes {
  std::uint64_t writes = 0, unlogged = 0, after_stop = 0, unlogged_while_migrating = 0;
  std::uint64_t last_t = 0;
};

// What the journals of the source's backends say.
struct Journals {
  std::vector<Region> regions;  // the newest memory table seen
  std::set<Object> objects;
  std::unordered_map<std::uint64_t, Writes> by_page;  // gpa / kPage
  std::uint64_t stop_t = 0;                           // the newest moment no ring ran any more
  std::uint64_t writes = 0, after_stop = 0;
};

Status read_journal(const std::string& path, Journals& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(Errc::not_found, fmt::format("cannot open the write journal {}", path));
  std::vector<Region> table;
  std::uint64_t running = 0;
  bool migrating = false;
  j::Record r{};
  while (f.read(reinterpret_cast<char*>(&r), sizeof r)) {
    switch (static_cast<j::Type>(r.type)) {
      case j::Type::event:
        switch (static_cast<j::Event>(r.kind)) {
          case j::Event::ring_started: running |= std::uint64_t{1} << (r.id % 64); break;
          case j::Event::ring_stopped:
            if (running != 0) {
              running &= ~(std::uint64_t{1} << (r.id % 64));
              if (running == 0) out.stop_t = std::max(out.stop_t, r.t_ns);
            }
            break;
          case j::Event::logging_on: migrating = true; break;
          case j::Event::logging_off: migrating = false; break;
          case j::Event::mem_table: table.clear(); break;
          case j::Event::mem_region: table.push_back({r.gpa, r.len, r.aux}); break;
          default: break;
        }
        break;
      case j::Type::object:
        out.objects.insert({static_cast<j::Object>(r.kind), r.id, r.gpa, r.len, r.aux});
        break;
      case j::Type::write: {
        ++out.writes;
        const bool after = (r.flags & j::kAfterStop) != 0;
        const bool unlogged = (r.flags & j::kLogged) == 0;
        if (after) ++out.after_stop;
        if (r.len == 0) break;
        const std::uint64_t last = (r.gpa + r.len - 1) / kPage;
        for (std::uint64_t p = r.gpa / kPage; p <= last && p - r.gpa / kPage < (1u << 20); ++p) {
          auto& w = out.by_page[p];
          ++w.writes;
          if (unlogged) ++w.unlogged;
          if (after) ++w.after_stop;
          if (unlogged && migrating) ++w.unlogged_while_migrating;
          w.last_t = std::max(w.last_t, r.t_ns);
        }
        break;
      }
      default:
        return make_error(Errc::invalid_argument,
                          fmt::format("{} is not a write journal (record type {})", path, static_cast<int>(r.type)));
    }
  }
  if (!table.empty()) out.regions = std::move(table);
  return {};
}

std::string object_name(const Object& o) {
  switch (o.kind) {
    case j::Object::vring: {
      static const char* parts[] = {"descriptor table", "driver area", "device area"};
      return fmt::format("vring {} {}", o.id, o.aux < 3 ? parts[o.aux] : "?");
    }
    case j::Object::cq_ring: return fmt::format("CQ {} ring", o.id);
    case j::Object::send_ring: return fmt::format("QP {} send ring", o.id);
    case j::Object::recv_ring: return fmt::format("QP {} receive ring", o.id);
    case j::Object::srq_ring: return fmt::format("SRQ {} ring", o.id);
    case j::Object::qp_status: return fmt::format("QP/SRQ {} status block", o.id);
    case j::Object::mr_page: return fmt::format("a page of MR {}", o.id);
    case j::Object::state_area: return "the device state area";
  }
  return "?";
}

Result<UniqueFd> open_ram(const std::string& path, std::uint64_t& size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return errno_error(errno, fmt::format("cannot open the guest RAM file {}", path));
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return errno_error(errno, "fstat " + path);
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

}  // namespace

Result<std::string> ram_of_pid(int pid) {
  const std::string dir = fmt::format("/proc/{}/fd", pid);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return errno_error(errno, fmt::format("cannot list the fds of process {}", pid));
  std::vector<std::string> found;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string link = dir + "/" + e->d_name;
    const auto n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n > 0 && std::strncmp(target, kQemuMemfd, sizeof kQemuMemfd - 1) == 0) found.push_back(link);
  }
  ::closedir(d);
  if (found.size() != 1)
    return make_error(Errc::not_found,
                      fmt::format("process {} holds {} memfds named memory-backend-memfd; one was expected (a QEMU "
                                  "with -object memory-backend-memfd for all its RAM)", pid, found.size()));
  return found.front();
}

Result<Report> compare(const std::string& source, const std::string& dest, const std::vector<std::string>& journals,
                       std::size_t max_pages) {
  const auto t0 = std::chrono::steady_clock::now();
  Journals jn;
  for (const auto& p : journals) VRDMA_TRY(read_journal(p, jn));
  std::uint64_t ssize = 0, dsize = 0;
  auto sfd = open_ram(source, ssize);
  if (!sfd) return std::move(sfd).error();
  auto dfd = open_ram(dest, dsize);
  if (!dfd) return std::move(dfd).error();
  if (ssize != dsize || ssize == 0 || ssize % kPage != 0)
    return make_error(Errc::invalid_argument, fmt::format("the source's RAM has {} bytes and the destination's {}; "
                                                          "they must be the same whole number of pages", ssize, dsize));
  Report rep;
  rep.journals = !journals.empty();
  rep.pages = ssize / kPage;
  rep.journal_writes = jn.writes;
  rep.journal_after_stop = jn.after_stop;
  constexpr std::size_t kChunk = 8u << 20;
  std::vector<std::uint8_t> a(kChunk), b(kChunk);
  for (std::uint64_t off = 0; off < ssize; off += kChunk) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, ssize - off));
    if (::pread(sfd->get(), a.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n) ||
        ::pread(dfd->get(), b.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n))
      return errno_error(errno ? errno : EIO, fmt::format("cannot read the guest RAM at offset {:#x}", off));
    if (std::memcmp(a.data(), b.data(), n) == 0) continue;
    for (std::size_t p = 0; p < n; p += kPage) {
      if (std::memcmp(a.data() + p, b.data() + p, kPage) == 0) continue;
      Page pg;
      pg.offset = off + p;
      pg.gpa = pg.offset;
      for (const auto& r : jn.regions)
        if (pg.offset >= r.offset && pg.offset - r.offset < r.size) {
          pg.gpa = r.gpa + (pg.offset - r.offset);
          pg.gpa_known = true;
          break;
        }
      for (std::uint32_t i = 0; i < kPage; ++i)
        if (a[p + i] != b[p + i]) {
          if (pg.bytes++ == 0) pg.first = i;
        }
      for (const auto& o : jn.objects)
        if (o.gpa < pg.gpa + kPage && pg.gpa < o.gpa + o.len) pg.holds.push_back(object_name(o));
      if (auto it = jn.by_page.find(pg.gpa / kPage); it != jn.by_page.end()) {
        const Writes& w = it->second;
        pg.writes = w.writes;
        pg.unlogged = w.unlogged;
        pg.after_stop = w.after_stop;
        pg.unlogged_while_migrating = w.unlogged_while_migrating;
        if (jn.stop_t != 0)
          pg.last_write_ms = (static_cast<double>(w.last_t) - static_cast<double>(jn.stop_t)) / 1e6;
      }
      pg.backend = pg.after_stop > 0 || pg.unlogged_while_migrating > 0;
      if (pg.after_stop > 0)
        pg.verdict = fmt::format("the backend's: it wrote this page {} times after the stop", pg.after_stop);
      else if (pg.unlogged_while_migrating > 0)
        pg.verdict = fmt::format("the backend's: it wrote this page {} times during the migration without marking the "
                                 "dirty log", pg.unlogged_while_migrating);
      else if (!rep.journals)
        pg.verdict = "not the backend's as far as can be told (no write journal given)";
      else if (pg.writes > 0)
        pg.verdict = fmt::format("the VMM's: the backend wrote this page {} times, each marked in the dirty log before "
                                 "the stop", pg.writes);
      else
        pg.verdict = "the VMM's: the backend never wrote this page";
      ++rep.differing;
      if (pg.backend) ++rep.backend_pages;
      if (rep.pages_listed.size() < max_pages) rep.pages_listed.push_back(std::move(pg));
    }
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

nlohmann::json Report::json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : pages_listed) {
    nlohmann::json o{{"offset", p.offset}, {"gpa", p.gpa}, {"gpa_from_journal", p.gpa_known}, {"bytes", p.bytes},
                     {"first", p.first}, {"holds", p.holds}, {"backend_writes", p.writes},
                     {"unlogged", p.unlogged}, {"after_stop", p.after_stop},
                     {"unlogged_while_migrating", p.unlogged_while_migrating}, {"backend", p.backend},
                     {"verdict", p.verdict}};
    if (p.last_write_ms) o["last_write_ms"] = *p.last_write_ms;
    list.push_back(std::move(o));
  }
  return {{"pages", pages},           {"differing", differing},       {"backend_pages", backend_pages},
          {"vmm_pages", vmm_pages()}, {"journals", journals},         {"journal_writes", journal_writes},
          {"journal_after_stop", journal_after_stop}, {"seconds", seconds}, {"listed", list}};
}

std::string Report::text() const {
  std::string s;
  const double mib = static_cast<double>(pages * kPage) / (1 << 20);
  if (differing == 0)
    s = fmt::format("guest memory identical: {} pages ({:.0f} MiB) compared in {:.2f} s", pages, mib, seconds);
  else
    s = fmt::format("guest memory DIFFERS in {} of {} pages ({:.0f} MiB): {} the backend's doing, {} the VMM's", differing,
                    pages, mib, backend_pages, vmm_pages());
  if (journals)
    s += fmt::format("; the backends' journals hold {} writes, {} of them after the stop", journal_writes,
                     journal_after_stop);
  s += "\n";
  for (const auto& p : pages_listed) {
    s += fmt::format("  gpa {:#x}{}: {} bytes differ from +{:#x}; holds {}; {}", p.gpa,
                     p.gpa_known ? "" : " (= RAM offset)", p.bytes, p.first,
                     p.holds.empty() ? std::string("no device object (guest kernel or application memory)")
                                     : fmt::format("{}", fmt::join(p.holds, ", ")),
                     p.verdict);
    if (p.last_write_ms) s += fmt::format("; its last backend write {:+.1f} ms from the stop", *p.last_write_ms);
    s += "\n";
  }
  if (differing > pages_listed.size()) s += fmt::format("  ... and {} more pages\n", differing - pages_listed.size());
  return s;
}

}  // namespace vrdma::test::memcmp
