// vrdma-memcmp: compares a migrated guest's RAM with its source's, page by page, and says of
// each page that differs whether the backend wrote it (its write journals) or the VMM lost it.
// Exit 0: identical; 1: pages differ; 2: usage; 3: the RAM or a journal could not be read.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "memcmp.hpp"
#include "vrdma/common/cli.hpp"

using namespace vrdma::test;

namespace {

// "pid:N" is that QEMU's RAM memfd; anything else a file.
bool resolve(std::string& what) {
  if (what.rfind("pid:", 0) != 0) return true;
  auto p = memcmp::ram_of_pid(std::atoi(what.c_str() + 4));
  if (!p) {
    std::fprintf(stderr, "vrdma-memcmp: %s\n", p.error().message.c_str());
    return false;
  }
  what = *p;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vrdma-memcmp: a migrated guest's RAM against its source's, page by page; each page that differs is "
               "told apart as the backend's doing (written after the stop, or unlogged during the migration) or the "
               "VMM's, from the backends' write journals (VRDMA_WRITE_JOURNAL)",
               "vrdma-memcmp"};
  vrdma::cli::prepare(app);
  std::string source, dest, report;
  std::vector<std::string> journals;
  bool json = false;
  std::size_t max_pages = 64;
  app.add_option("source", source, "the source's guest RAM: a file (e.g. /proc/PID/fd/N of its memfd) or pid:PID of "
                                   "a QEMU with a memory-backend-memfd")->required();
  app.add_option("destination", dest, "the destination's guest RAM, the same way")->required();
  app.add_option("--journal", journals, "a write journal of the source's backend (repeatable)");
  app.add_option("--max-pages", max_pages, "list at most this many differing pages")->capture_default_str();
  app.add_flag("--json", json, "one JSON object on stdout");
  app.add_option("--report", report, "also write the JSON object to this file");
  if (auto rc = vrdma::cli::parse(app, argc, argv)) return *rc;
  if (!resolve(source) || !resolve(dest)) return 3;
  auto rep = memcmp::compare(source, dest, journals, max_pages);
  if (!rep) {
    std::fprintf(stderr, "vrdma-memcmp: %s\n", rep.error().message.c_str());
    return 3;
  }
  std::fputs(json ? (rep->json().dump() + "\n").c_str() : rep->text().c_str(), stdout);
  if (!report.empty()) {
    std::FILE* f = std::fopen(report.c_str(), "w");
    if (f == nullptr || std::fputs((rep->json().dump() + "\n").c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "vrdma-memcmp: cannot write the report to %s\n", report.c_str());
      return 3;
    }
  }
  return rep->differing == 0 ? 0 : 1;
}

