// Owners of libvirt connection and domain handles, and libvirt's last error as a sentence part
// (vrdmactl migrate, vrdmactl domain attach/detach --live).
#pragma once

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include <cstdlib>
#include <string>

namespace vrdma::integration {

struct Conn {
  virConnectPtr c = nullptr;
  Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ~Conn() {
    if (c) virConnectClose(c);
  }
};

struct Dom {
  virDomainPtr d = nullptr;
  Dom() = default;
  Dom(const Dom&) = delete;
  Dom& operator=(const Dom&) = delete;
  ~Dom() {
    if (d) virDomainFree(d);
  }
};

inline std::string last_libvirt_error() {
  const virError* e = virGetLastError();
  return e && e->message ? e->message : "unknown libvirt error";
}

// libvirt prints every error on stderr by default; our tools say it once, in their own sentence.
inline void silent_libvirt_error(void*, virErrorPtr) {}

// $LIBVIRT_DEFAULT_URI, else qemu:///system, when `connect` is empty.
inline std::string libvirt_uri(const std::string& connect) {
  if (!connect.empty()) return connect;
  const char* e = std::getenv("LIBVIRT_DEFAULT_URI");
  return e && *e ? e : "qemu:///system";
}

}  // namespace vrdma::integration
