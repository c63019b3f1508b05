#include "privileges.hpp"

#include <sys/capability.h>
#include <sys/prctl.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <type_traits>

namespace vrdma::vrdmad {

namespace {

constexpr cap_value_t kKeep[] = {CAP_CHOWN, CAP_NET_ADMIN, CAP_NET_RAW, CAP_IPC_LOCK};

bool kept(cap_value_t c) {
  for (auto k : kKeep)
    if (k == c) return true;
  return false;
}

struct CapFree {
  void operator()(cap_t c) const { cap_free(c); }
};
using CapPtr = std::unique_ptr<std::remove_pointer_t<cap_t>, CapFree>;

Error sys_error(const std::string& what) {
  return make_error(Errc::io_error, "cannot drop privileges: " + what + ": " + std::strerror(errno));
}

}  // namespace

Result<std::string> drop_privileges() {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return sys_error("prctl(PR_SET_NO_NEW_PRIVS)");
  CapPtr now(cap_get_proc());
  if (!now) return sys_error("cap_get_proc");
  // The bounding set first: dropping from it needs CAP_SETPCAP, which goes with the rest below.
  cap_flag_value_t setpcap = CAP_CLEAR;
  (void)cap_get_flag(now.get(), CAP_SETPCAP, CAP_EFFECTIVE, &setpcap);
  const cap_value_t last = static_cast<cap_value_t>(cap_max_bits()) - 1;
  if (setpcap == CAP_SET) {
    for (cap_value_t c = 0; c <= last; ++c) {
      if (kept(c) || CAP_IS_SUPPORTED(c) == 0) continue;
      if (cap_drop_bound(c) != 0 && errno != EINVAL) return sys_error("cap_drop_bound");
    }
  }
  if (cap_reset_ambient() != 0 && errno != EINVAL) return sys_error("cap_reset_ambient");
  // Keep what is both wanted and held; nothing inheritable.
  CapPtr next(cap_init());
  if (!next) return sys_error("cap_init");
  for (auto c : kKeep) {
    cap_flag_value_t held = CAP_CLEAR;
    if (cap_get_flag(now.get(), c, CAP_PERMITTED, &held) == 0 && held == CAP_SET) {
      if (cap_set_flag(next.get(), CAP_PERMITTED, 1, &c, CAP_SET) != 0 ||
          cap_set_flag(next.get(), CAP_EFFECTIVE, 1, &c, CAP_SET) != 0)
        return sys_error("cap_set_flag");
    }
  }
  if (cap_set_proc(next.get()) != 0) return sys_error("cap_set_proc");
  CapPtr after(cap_get_proc());
  if (!after) return sys_error("cap_get_proc");
  char* text = cap_to_text(after.get(), nullptr);
  std::string words = text != nullptr ? text : "?";
  cap_free(text);
  if (words == "=") words = "none";
  return "capabilities " + words + ", no new privileges";
}

}  // namespace vrdma::vrdmad
