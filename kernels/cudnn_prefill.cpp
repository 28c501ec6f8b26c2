// The cuDNN paged-SDPA prefill graph (kernels/cudnn_prefill.hpp): the one translation unit
// that includes the cuDNN frontend (header-only, large: compiled once into kvmm_cudnn).
#include "cudnn_prefill.hpp"

#include <cudnn_frontend.h>
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

namespace fe = cudnn_frontend;

namespace kvmm::kernels::experimental {

namespace {

enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kSeqQ, kSeqKV, kTableK, kTableV, kQOffsets, kOOffsets };

void check(fe::error_t e, const char* stage, const std::string& what) {
  if (e.is_good()) return;
  fail("cuDNN SDPA (cudnnGetVersion {}): {}: {} (frontend error code {}); graph: {}", cudnnGetVersion(), stage,
       e.get_message(), static_cast<int>(e.get_code()), what);
}

std::shared_ptr<fe::graph::Tensor_attributes> index_tensor(fe::graph::Graph& g, const char* name, std::int64_t uid,
                                                           std::int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_data_type(fe::DataType_t::INT32)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1}));
}

}  // namespace

struct CudnnPagedPrefill::Impl {
  CudnnPrefillShape s;
  std::int64_t kv_strides[4] = {};
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  ~Impl() {
    if (handle != nullptr) cudnnDestroy(handle);
  }
};

std::string CudnnPagedPrefill::describe() const {
  const CudnnPrefillShape& s = impl_->s;
  const std::int64_t* st = impl_->kv_strides;
  return fmt::format(
      "{} K/V containers dims [pages {}, kv_heads {}, page_size {}, head_dim {}] strides [{}, {}, {}, {}] elements, "
      "page table [{}, 1, {}, 1] int32, Q/O [{}, {}, {}, {}] ragged, {}, causal bottom-right",
      s.layout == CudnnKVLayout::kPageLayer ? "kvmm page-layer" : "head-major packed", s.num_pages, s.kv_heads,
      s.tokens_per_page, s.head_dim, st[0], st[1], st[2], st[3], s.batch, s.pages_per_seq, s.batch, s.q_heads,
      s.max_q_len, s.head_dim, s.dtype == DType::kBF16 ? "bf16" : "fp16");
}

CudnnPagedPrefill::CudnnPagedPrefill(const CudnnPrefillShape& shape) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.s = shape;
  const CudnnPrefillShape& s = m.s;
  if (s.dtype != DType::kBF16 && s.dtype != DType::kF16)
    fail("dtype = {}: cuDNN's paged SDPA takes fp16/bf16", static_cast<int>(s.dtype));
  if (s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.head_dim == 0 || s.tokens_per_page == 0 ||
      s.max_q_len == 0 || s.pages_per_seq == 0 || s.num_pages == 0)
    fail(
        "CudnnPrefillShape: batch {}, q_heads {}, kv_heads {}, head_dim {}, tokens_per_page {}, max_q_len {}, "
        "pages_per_seq {}, num_pages {}: every one must be >= 1",
        s.batch, s.q_heads, s.kv_heads, s.head_dim, s.tokens_per_page, s.max_q_len, s.pages_per_seq, s.num_pages);
  if (s.q_heads % s.kv_heads != 0) fail("q_heads = {} is not a multiple of kv_heads = {}", s.q_heads, s.kv_heads);
  cudnn_container_strides(s.layout, s.page_stride, s.kv_heads, s.tokens_per_page, s.head_dim, 2, m.kv_strides);
  const std::string what = describe();

  if (const cudnnStatus_t st = cudnnCreate(&m.handle); st != CUDNN_STATUS_SUCCESS) {
    m.handle = nullptr;
    fail("cudnnCreate: {} (cudnnGetVersion {})", cudnnGetErrorString(st), cudnnGetVersion());
  }
  const std::int64_t b = s.batch, hq = s.q_heads, hk = s.kv_heads, d = s.head_dim, sq = s.max_q_len,
                     t = s.tokens_per_page, pages = static_cast<std::int64_t>(s.num_pages), cols = s.pages_per_seq;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // kvmm's packed rows: token-major, heads inside a token ("THD"), request b from q_offsets[b].
  const std::vector<std::int64_t> qo_dims = {b, hq, sq, d}, qo_strides = {sq * hq * d, d, hq * d, 1};
  auto q_off = index_tensor(*g, "q_offsets", kQOffsets, b + 1);
  auto o_off = index_tensor(*g, "o_offsets", kOOffsets, b + 1);
  auto q = g->tensor(fe::graph::Tensor_attributes()
                         .set_name("Q")
                         .set_uid(kQ)
                         .set_dim(qo_dims)
                         .set_stride(qo_strides)
                         .set_ragged_offset(q_off));
  const std::vector<std::int64_t> kv_dims = {pages, hk, t, d},
                                  kv_str = {m.kv_strides[0], m.kv_strides[1], m.kv_strides[2], m.kv_strides[3]};
  auto k =
      g->tensor(fe::graph::Tensor_attributes().set_name("K_container").set_uid(kK).set_dim(kv_dims).set_stride(kv_str));
  auto v =
      g->tensor(fe::graph::Tensor_attributes().set_name("V_container").set_uid(kV).set_dim(kv_dims).set_stride(kv_str));
  auto seq_q = index_tensor(*g, "seq_len_q", kSeqQ, b);
  auto seq_kv = index_tensor(*g, "seq_len_kv", kSeqKV, b);
  auto table = [&](const char* name, std::int64_t uid) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_data_type(fe::DataType_t::INT32)
                         .set_dim({b, 1, cols, 1})
                         .set_stride({cols, cols, 1, 1}));
  };
  const float scale = s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("kvmm_paged_prefill")
                   .set_generate_stats(false)
                   .set_attn_scale(scale)
                   .set_causal_mask_bottom_right(true)
                   .set_padding_mask(true)
                   .set_seq_len_q(seq_q)
                   .set_seq_len_kv(seq_kv)
                   .set_paged_attention_k_table(table("page_table_k", kTableK))
                   .set_paged_attention_v_table(table("page_table_v", kTableV))
                   .set_paged_attention_max_seq_len_kv(static_cast<int>(cols * t));
  auto outs = g->sdpa(q, k, v, attrs);
  outs[0]->set_output(true).set_uid(kO).set_dim(qo_dims).set_stride(qo_strides).set_ragged_offset(o_off);

  check(g->validate(), "validate", what);
  check(g->build_operation_graph(m.handle), "build_operation_graph", what);
  // Heuristics A first, then cuDNN's fallback list (slower engines, but a measured answer).
  check(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans", what);
  check(g->check_support(m.handle), "check_support", what);
  check(g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans", what);
  check(g->get_workspace_size(m.workspace), "get_workspace_size", what);
  m.graph = std::move(g);
}

CudnnPagedPrefill::~CudnnPagedPrefill() = default;

std::size_t CudnnPagedPrefill::workspace_bytes() const { return static_cast<std::size_t>(impl_->workspace); }

void CudnnPagedPrefill::run(const CudnnPrefillArgs& a, void* workspace, Stream stream) const {
  Impl& m = *impl_;
  if (a.q == nullptr || a.o == nullptr || a.k == nullptr || a.v == nullptr || a.page_table == nullptr ||
      a.seq_len_q == nullptr || a.seq_len_kv == nullptr || a.q_offsets == nullptr)
    fail("CudnnPrefillArgs: a device pointer is null");
  if (m.workspace > 0 && workspace == nullptr) fail("workspace = null: the graph needs {} bytes", m.workspace);
  if (const cudnnStatus_t st = cudnnSetStream(m.handle, static_cast<cudaStream_t>(stream)); st != CUDNN_STATUS_SUCCESS)
    fail("cudnnSetStream: {}", cudnnGetErrorString(st));
  auto* offsets = const_cast<std::int32_t*>(a.q_offsets);
  auto* table = const_cast<std::int32_t*>(a.page_table);
  std::unordered_map<std::int64_t, void*> pack = {{kQ, const_cast<void*>(a.q)},
                                                  {kK, const_cast<void*>(a.k)},
                                                  {kV, const_cast<void*>(a.v)},
                                                  {kO, a.o},
                                                  {kSeqQ, const_cast<std::int32_t*>(a.seq_len_q)},
                                                  {kSeqKV, const_cast<std::int32_t*>(a.seq_len_kv)},
                                                  {kTableK, table},
                                                  {kTableV, table},
                                                  {kQOffsets, offsets},
                                                  {kOOffsets, offsets}};
  check(m.graph->execute(m.handle, pack, workspace), "execute", describe());
}

int cudnn_runtime_version() { return static_cast<int>(cudnnGetVersion()); }
int cudnn_header_version() { return CUDNN_VERSION; }

}  // namespace kvmm::kernels::experimental
