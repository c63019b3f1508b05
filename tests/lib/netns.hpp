// Test hosts as network namespaces (real kernel, real veth), made and removed by the test.
// Addresses are private to the namespaces the test creates; nothing leaves them.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace vrdma::test {

// True if this process may create network namespaces (root / CAP_SYS_ADMIN).
bool can_make_netns();

// Runs a shell command; returns its exit status. Output goes to the test log.
int sh(const std::string& cmd);

// Two namespaces "<prefix>a" and "<prefix>b" joined by a veth pair, with
// 10.<net>.0.1/24 in a and 10.<net>.0.2/24 in b. Removed on destruction.
class NetnsPair {
 public:
  explicit NetnsPair(const std::string& prefix, int net = 233, int mtu = 9000);
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  [[nodiscard]] const std::string& ns_a() const { return a_; }
  [[nodiscard]] const std::string& ns_b() const { return b_; }
  [[nodiscard]] std::string ip_a() const;
  [[nodiscard]] std::string ip_b() const;
  [[nodiscard]] std::string veth_a() const { return a_ + "v"; }
  [[nodiscard]] std::string veth_b() const { return b_ + "v"; }
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  std::string a_, b_;
  int net_;
  bool ok_ = false;
};

// Runs fn on a new thread whose network namespace is `ns` (sockets it opens live there),
// and waits for it. Returns false if the namespace could not be entered.
bool run_in_netns(const std::string& ns, const std::function<void()>& fn);

}  // namespace vrdma::test
