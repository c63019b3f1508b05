// Baseline for the latency benchmark: 64-byte UDP ping-pong over the same veth the RDMA test
// uses, so the ratio isolates what the RDMA engine adds.
//   udp_pingpong server <ip> <port>        echo every datagram back
//   udp_pingpong client <ip> <port> <n>    print {"avg_us":..,"p50_us":..,"p99_us":..}
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: udp_pingpong server|client IP PORT [N]\n");
    return 2;
  }
  bool server = std::strcmp(argv[1], "server") == 0;
  int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::atoi(argv[3])));
  ::inet_pton(AF_INET, argv[2], &a.sin_addr);
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[64] = {};
  if (server) {
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 1;
    for (;;) {
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      ssize_t n = ::recvfrom(s, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (n <= 0) return 0;  // idle for 5 s: done
      ::sendto(s, buf, static_cast<std::size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), fl);
    }
  }
  int iters = argc > 4 ? std::atoi(argv[4]) : 10000;
  std::vector<double> lat;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ::sendto(s, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
    if (::recv(s, buf, sizeof buf, 0) <= 0) {
      std::fprintf(stderr, "udp_pingpong: no echo from the server\n");
      return 1;
    }
    lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 2);
  }
  std::sort(lat.begin(), lat.end());
  double sum = 0;
  for (double d : lat) sum += d;
  std::printf("{\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f}\n", sum / static_cast<double>(lat.size()),
              lat[lat.size() / 2], lat[lat.size() * 99 / 100]);
  return 0;
}
