// Deterministic stand-in for libFuzzer's main (non-clang builds): replays every file in the
// corpus directories given on the command line, then a bounded number of pseudo-random inputs.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  std::size_t files = 0;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (!std::filesystem::is_directory(argv[i], ec)) continue;
    for (const auto& e : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream f(e.path(), std::ios::binary);
      std::vector<std::uint8_t> buf((std::istreambuf_iterator<char>(f)), {});
      LLVMFuzzerTestOneInput(buf.data(), buf.size());
      ++files;
    }
  }
  std::mt19937_64 rng(0x7672646d61ULL);
  std::vector<std::uint8_t> buf;
  constexpr int kRuns = 20000;
  for (int r = 0; r < kRuns; ++r) {
    buf.resize(rng() % 4200);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("fuzz driver: %zu corpus files and %d random inputs ran clean\n", files, kRuns);
  return 0;
}
