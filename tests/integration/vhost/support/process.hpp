// Child processes for vhost tests: the backend runs as a real process.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace vrdma::test {

// A fresh directory under /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class Child {
 public:
  // fork+exec argv[0] with stdout/stderr appended to log_path.
  Child(const std::vector<std::string>& argv, const std::string& log_path);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] bool alive();
  // Sends sig and waits up to timeout_ms; returns the wait status, or -1 if it did not exit
  // (then it is SIGKILLed).
  int stop(int sig, int timeout_ms = 5000);
  // Waits for exit up to timeout_ms without signalling; -1 on timeout.
  int wait(int timeout_ms);
  // Number of open fds of the child (/proc/PID/fd).
  [[nodiscard]] int open_fds() const;

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

std::string read_file(const std::string& path);
// How often `what` occurs in `text` (log lines, say).
std::size_t count_in(const std::string& text, const std::string& what);
// Waits until `path` exists (a socket appearing), up to timeout_ms.
bool wait_for_path(const std::string& path, int timeout_ms);

}  // namespace vrdma::test
