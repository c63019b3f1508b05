// The C API of libpvverbs (vrdma/pvverbs.h) over the pv provider.
#include "vrdma/pvverbs.h"

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "vrdma/guest/pv.hpp"
#include "vrdma/nicdrv/registry.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;

struct pv_context {
  std::shared_ptr<Device> dev;
  std::mutex mu;
  std::unordered_map<void*, std::shared_ptr<Buffer>> bufs;
};
struct pv_pd {
  std::shared_ptr<ProtectionDomain> pd;
};
struct pv_cq {
  std::shared_ptr<CompletionQueue> cq;
};
struct pv_qp {
  std::shared_ptr<QueuePair> qp;
};
struct pv_ah {
  std::shared_ptr<AddressHandle> ah;
};
struct pv_srq {
  std::shared_ptr<SharedReceiveQueue> srq;
};
namespace {

struct MrBox {
  pv_mr pub;  // first: the pointer handed out is &pub
  std::shared_ptr<MemoryRegion> mr;
};

thread_local std::string g_last_error;

int fail(const Error& e) {
  g_last_error = e.message;
  errno = errno_of(e.errc());
  return errno;
}
template <class T>
T* fail_null(const Error& e) {
  fail(e);
  return nullptr;
}
int bad_arg(const char* what) {
  g_last_error = std::string(what) + " is NULL";
  errno = EINVAL;
  return EINVAL;
}

AhAttr ah_of(const pv_ah_attr& a) {
  AhAttr o;
  std::memcpy(o.dgid.raw.data(), a.dgid.raw, 16);
  o.flow_label = a.flow_label;
  o.sgid_index = a.sgid_index;
  o.hop_limit = a.hop_limit != 0 ? a.hop_limit : 64;
  o.traffic_class = a.traffic_class;
  o.sl = a.sl;
  o.port_num = a.port_num != 0 ? a.port_num : 1;
  return o;
}

}  // namespace

extern "C" {

pv_context* pv_open_device(const char* name) {
  if (name == nullptr) return bad_arg("device name"), nullptr;
  std::string n(name);
  if (n.rfind("pv:", 0) != 0) n = "pv:" + n;
  auto d = open_device(n);
  if (!d) return fail_null<pv_context>(d.error());
  auto* c = new pv_context;
  c->dev = std::move(*d);
  return c;
}

int pv_close_device(pv_context* ctx) {
  delete ctx;
  return 0;
}

const char* pv_last_error(void) { return g_last_error.c_str(); }

int pv_query_gid(pv_context* ctx, int index, pv_gid* gid) {
  if (ctx == nullptr || gid == nullptr) return bad_arg("context or gid");
  auto g = ctx->dev->query_gid(static_cast<std::uint32_t>(index));
  if (!g) return fail(g.error());
  std::memcpy(gid->raw, g->gid.raw.data(), 16);
  return 0;
}

void* pv_alloc_buf(pv_context* ctx, size_t length) {
  if (ctx == nullptr) return bad_arg("context"), nullptr;
  auto b = ctx->dev->alloc_buffer(length);
  if (!b) return fail_null<void>(b.error());
  std::lock_guard lk(ctx->mu);
  void* p = (*b)->data();
  ctx->bufs[p] = std::move(*b);
  return p;
}

int pv_free_buf(pv_context* ctx, void* buf) {
  if (ctx == nullptr) return bad_arg("context");
  std::lock_guard lk(ctx->mu);
  if (ctx->bufs.erase(buf) == 0) {
    g_last_error = "pv_free_buf: the pointer did not come from pv_alloc_buf";
    return errno = EINVAL;
  }
  return 0;
}

pv_pd* pv_alloc_pd(pv_context* ctx) {
  if (ctx == nullptr) return bad_arg("context"), nullptr;
  auto pd = ctx->dev->alloc_pd();
  if (!pd) return fail_null<pv_pd>(pd.error());
  return new pv_pd{std::move(*pd)};
}

int pv_dealloc_pd(pv_pd* pd) {
  delete pd;
  return 0;
}

pv_mr* pv_reg_mr(pv_pd* pd, void* addr, size_t length, int access) {
  if (pd == nullptr) return bad_arg("pd"), nullptr;
  auto mr = pd->pd->reg_mr(addr, length, static_cast<Access>(access));
  if (!mr) return fail_null<pv_mr>(mr.error());
  auto* box = new MrBox{{addr, length, (*mr)->lkey(), (*mr)->rkey()}, std::move(*mr)};
  return &box->pub;
}

int pv_dereg_mr(pv_mr* mr) {
  delete reinterpret_cast<MrBox*>(mr);  // pub is MrBox's first member
  return 0;
}

pv_cq* pv_create_cq(pv_context* ctx, int cqe) {
  if (ctx == nullptr || cqe <= 0) return bad_arg("context or cqe"), nullptr;
  auto cq = ctx->dev->create_cq(static_cast<std::uint32_t>(cqe));
  if (!cq) return fail_null<pv_cq>(cq.error());
  return new pv_cq{std::move(*cq)};
}

int pv_destroy_cq(pv_cq* cq) {
  delete cq;
  return 0;
}

int pv_poll_cq(pv_cq* cq, int num_entries, pv_wc* wc) {
  if (cq == nullptr || wc == nullptr || num_entries < 0) return -bad_arg("cq or wc");
  std::vector<WorkCompletion> tmp(static_cast<std::size_t>(num_entries));
  auto n = cq->cq->poll(tmp);
  if (!n) return -fail(n.error());
  for (std::size_t i = 0; i < *n; ++i) {
    const auto& w = tmp[i];
    wc[i] = pv_wc{w.wr_id, static_cast<int>(w.status), static_cast<int>(w.opcode), w.vendor_err, w.byte_len,
                  w.imm_data, w.qp_num, w.src_qp, static_cast<unsigned>(w.wc_flags)};
  }
  return static_cast<int>(*n);
}

int pv_req_notify_cq(pv_cq* cq, int solicited_only) {
  if (cq == nullptr) return bad_arg("cq");
  auto s = cq->cq->req_notify(solicited_only != 0);
  return s.ok() ? 0 : fail(s.error());
}

int pv_cq_event_fd(pv_cq* cq) { return cq != nullptr ? cq->cq->event_fd() : -1; }
void pv_ack_cq_events(pv_cq* cq) {
  if (cq != nullptr) cq->cq->ack_events();
}

pv_qp* pv_create_qp(pv_pd* pd, const pv_qp_init_attr* attr) {
  if (pd == nullptr || attr == nullptr || attr->send_cq == nullptr || attr->recv_cq == nullptr)
    return bad_arg("pd, attr or a CQ"), nullptr;
  QpInitAttr ia;
  ia.type = attr->qp_type == PV_QPT_UD ? QpType::ud : QpType::rc;
  ia.send_cq = attr->send_cq->cq.get();
  ia.recv_cq = attr->recv_cq->cq.get();
  ia.srq = attr->srq != nullptr ? attr->srq->srq.get() : nullptr;
  ia.cap = QpCap{attr->cap.max_send_wr, attr->cap.max_recv_wr, attr->cap.max_send_sge, attr->cap.max_recv_sge,
                 attr->cap.max_inline_data};
  ia.sq_sig_all = attr->sq_sig_all != 0;
  auto qp = pd->pd->create_qp(ia);
  if (!qp) return fail_null<pv_qp>(qp.error());
  return new pv_qp{std::move(*qp)};
}

int pv_modify_qp(pv_qp* qp, const pv_qp_attr* a, int mask) {
  if (qp == nullptr || a == nullptr) return bad_arg("qp or attr");
  if (a->qp_state < PV_QPS_RESET || a->qp_state > PV_QPS_ERR || (a->path_mtu != 0 && (a->path_mtu < 1 || a->path_mtu > 5))) {
    g_last_error = "pv_modify_qp: qp_state or path_mtu out of range";
    return errno = EINVAL;
  }
  QpAttr o;
  o.qp_state = static_cast<QpState>(a->qp_state);
  o.path_mtu = a->path_mtu != 0 ? static_cast<Mtu>(a->path_mtu) : Mtu::mtu1024;
  o.qkey = a->qkey;
  o.rq_psn = a->rq_psn;
  o.sq_psn = a->sq_psn;
  o.dest_qp_num = a->dest_qp_num;
  o.qp_access_flags = static_cast<Access>(a->qp_access_flags);
  o.ah_attr = ah_of(a->ah_attr);
  o.pkey_index = a->pkey_index;
  o.max_rd_atomic = a->max_rd_atomic;
  o.max_dest_rd_atomic = a->max_dest_rd_atomic;
  o.min_rnr_timer = a->min_rnr_timer;
  o.port_num = a->port_num != 0 ? a->port_num : 1;
  o.timeout = a->timeout;
  o.retry_cnt = a->retry_cnt;
  o.rnr_retry = a->rnr_retry;
  auto s = qp->qp->modify(o, static_cast<QpAttrMask>(mask));
  return s.ok() ? 0 : fail(s.error());
}

int pv_destroy_qp(pv_qp* qp) {
  delete qp;
  return 0;
}

uint32_t pv_qp_num(const pv_qp* qp) { return qp != nullptr ? qp->qp->qp_num() : 0; }

int pv_post_send(pv_qp* qp, pv_send_wr* wr, pv_send_wr** bad_wr) {
  if (qp == nullptr) return bad_arg("qp");
  // The whole list goes to the device in one post (one doorbell).
  std::vector<pv_send_wr*> src;
  std::size_t nsge = 0;
  for (pv_send_wr* w = wr; w != nullptr; w = w->next) {
    if (w->num_sge < 0 || w->num_sge > 64 || (w->num_sge > 0 && w->sg_list == nullptr) || w->opcode < 0 || w->opcode > 6) {
      if (bad_wr) *bad_wr = w;
      g_last_error = "pv_post_send: a work request has a bad opcode or SGE list";
      return errno = EINVAL;
    }
    src.push_back(w);
    nsge += static_cast<std::size_t>(w->num_sge);
  }
  std::vector<Sge> sges;
  sges.reserve(nsge);
  std::vector<SendWr> wrs(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    const pv_send_wr* w = src[i];
    const std::size_t first = sges.size();
    for (int k = 0; k < w->num_sge; ++k) sges.push_back(Sge{w->sg_list[k].addr, w->sg_list[k].length, w->sg_list[k].lkey});
    SendWr& s = wrs[i];
    s.wr_id = w->wr_id;
    s.opcode = static_cast<WrOpcode>(w->opcode);
    s.flags = static_cast<SendFlags>(w->send_flags & 0xfu);
    s.sg_list = std::span<const Sge>(sges.data() + first, static_cast<std::size_t>(w->num_sge));
    s.imm_data = w->imm_data;
    if (w->opcode == PV_WR_ATOMIC_CMP_AND_SWP || w->opcode == PV_WR_ATOMIC_FETCH_AND_ADD) {
      s.atomic.remote_addr = w->wr.atomic.remote_addr;
      s.atomic.rkey = w->wr.atomic.rkey;
      s.atomic.compare_add = w->wr.atomic.compare_add;
      s.atomic.swap = w->wr.atomic.swap;
    } else {
      s.rdma.remote_addr = w->wr.rdma.remote_addr;
      s.rdma.rkey = w->wr.rdma.rkey;
    }
    s.ud.ah = w->ud.ah != nullptr ? w->ud.ah->ah.get() : nullptr;
    s.ud.remote_qpn = w->ud.remote_qpn;
    s.ud.remote_qkey = w->ud.remote_qkey;
  }
  std::size_t bad = 0;
  auto st = qp->qp->post_send(wrs, &bad);
  if (!st.ok()) {
    if (bad_wr) *bad_wr = bad < src.size() ? src[bad] : nullptr;
    return fail(st.error());
  }
  return 0;
}

int pv_post_recv(pv_qp* qp, pv_recv_wr* wr, pv_recv_wr** bad_wr) {
  if (qp == nullptr) return bad_arg("qp");
  std::vector<pv_recv_wr*> src;
  std::size_t nsge = 0;
  for (pv_recv_wr* w = wr; w != nullptr; w = w->next) {
    if (w->num_sge < 0 || w->num_sge > 64 || (w->num_sge > 0 && w->sg_list == nullptr)) {
      if (bad_wr) *bad_wr = w;
      g_last_error = "pv_post_recv: a work request has a bad SGE list";
      return errno = EINVAL;
    }
    src.push_back(w);
    nsge += static_cast<std::size_t>(w->num_sge);
  }
  std::vector<Sge> sges;
  sges.reserve(nsge);
  std::vector<RecvWr> wrs(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    const std::size_t first = sges.size();
    for (int k = 0; k < src[i]->num_sge; ++k)
      sges.push_back(Sge{src[i]->sg_list[k].addr, src[i]->sg_list[k].length, src[i]->sg_list[k].lkey});
    wrs[i] = RecvWr{src[i]->wr_id, std::span<const Sge>(sges.data() + first, static_cast<std::size_t>(src[i]->num_sge))};
  }
  std::size_t bad = 0;
  auto st = qp->qp->post_recv(wrs, &bad);
  if (!st.ok()) {
    if (bad_wr) *bad_wr = bad < src.size() ? src[bad] : nullptr;
    return fail(st.error());
  }
  return 0;
}

pv_ah* pv_create_ah(pv_pd* pd, const pv_ah_attr* attr) {
  if (pd == nullptr || attr == nullptr) return bad_arg("pd or attr"), nullptr;
  auto ah = pd->pd->create_ah(ah_of(*attr));
  if (!ah) return fail_null<pv_ah>(ah.error());
  return new pv_ah{std::move(*ah)};
}

int pv_destroy_ah(pv_ah* ah) {
  delete ah;
  return 0;
}

}  // extern "C"
