#include "vrdma/vhost/virtio_rdma.hpp"

#include <array>

namespace vrdma::vrdma_dev {

std::string_view cmd_name(std::uint32_t cmd) noexcept {
  static constexpr std::array<std::string_view, 20> kNames{
      "?",          "QUERY_DEVICE", "QUERY_PORT", "QUERY_GID", "CREATE_PD", "DESTROY_PD",
      "REG_MR",     "DEREG_MR",     "CREATE_CQ",  "DESTROY_CQ", "CREATE_QP", "MODIFY_QP",
      "QUERY_QP",   "DESTROY_QP",   "CREATE_AH",  "DESTROY_AH", "CREATE_SRQ", "DESTROY_SRQ", "QUERY_CONFIG",
      "REG_DMA_MR"};
  static_assert(kNames.size() == static_cast<std::size_t>(Cmd::count_));
  return cmd < kNames.size() ? kNames[cmd] : std::string_view("UNKNOWN");
}

}  // namespace vrdma::vrdma_dev

