// CPU references of the attention kernels: the same masks, ranges and split-KV merge as
// the device code, computed in double and rounded once to the output dtype.
#include "kvmm/error.hpp"
#include "kvmm/kernels/addressing.hpp"
#include "kvmm/kernels/attention.hpp"
#include "kvmm/kernels/online_softmax.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kvmm::kernels {
namespace {

struct Exp {
  double operator()(double x) const { return std::exp(x); }
};

static_assert(kNullPageId == kNullPage, "the shared addressing's null page is kvmm's");

struct Shape {
  std::uint32_t kv_heads;
  std::uint32_t head_dim;
  DType dtype;
};

std::uint16_t load16(const void* base, std::uint64_t byte_offset) {
  std::uint16_t v;
  std::memcpy(&v, static_cast<const char*>(base) + byte_offset, sizeof v);
  return v;
}

// Key addressing of the paged layout: byte offset of (token, head 0) or -1 for a null page;
// head h lies head_stride() x h further (kv_strides of the cache's order).
class PagedKeys {
 public:
  PagedKeys(const PagedAttentionParams& p) : p_(p), strides_(kv_strides(p.cache)) {}
  std::uint64_t head_stride() const { return strides_.head; }
  void select(std::uint32_t b) {
    const PageTableView& t = p_.table;
    if (t.indptr != nullptr) {
      if (t.indptr[b + 1] < t.indptr[b])
        fail("table.indptr[{}] = {}: smaller than indptr[{}] = {}", b + 1, t.indptr[b + 1], b, t.indptr[b]);
      row_ = t.pages + t.indptr[b];
      count_ = t.indptr[b + 1] - t.indptr[b];
    } else {
      row_ = t.pages + std::uint64_t{b} * t.dense_stride;
      count_ = t.dense_stride;
    }
    batch_row_ = b;
  }
  void check_len(std::uint32_t kv_len) const {
    const std::uint64_t need = (std::uint64_t{kv_len} + p_.cache.tokens_per_page - 1) / p_.cache.tokens_per_page;
    if (need > count_)
      fail("query.kv_lens[{}] = {}: needs {} pages, the page table row has {}", batch_row_, kv_len, need, count_);
  }
  std::int64_t offset(std::uint32_t tok) const {
    const PageId page = row_[page_of_token(tok, p_.cache.tokens_per_page)];
    return paged_token_offset(page, tok, p_.cache.tokens_per_page, p_.cache.page_stride_bytes, strides_.token);
  }

 private:
  const PagedAttentionParams& p_;
  KVStrides strides_;
  const PageId* row_ = nullptr;
  std::uint64_t count_ = 0;
  std::uint32_t batch_row_ = 0;
};

class ContiguousKeys {
 public:
  ContiguousKeys(const ContiguousAttentionParams& p) : p_(p), strides_(kv_strides(p.cache)) {}
  std::uint64_t head_stride() const { return strides_.head; }
  void select(std::uint32_t b) {
    base_ = p_.slot_idx[b] * p_.cache.slot_stride_bytes;
    batch_row_ = b;
  }
  void check_len(std::uint32_t kv_len) const {
    if (kv_len > p_.cache.max_ctx)
      fail("query.kv_lens[{}] = {}: larger than cache.max_ctx ({})", batch_row_, kv_len, p_.cache.max_ctx);
  }
  std::int64_t offset(std::uint32_t tok) const { return slot_row_offset(base_, 1, tok, strides_.token); }

 private:
  const ContiguousAttentionParams& p_;
  KVStrides strides_;
  std::uint64_t base_ = 0;
  std::uint32_t batch_row_ = 0;
};

// Long by design (lint): the reference is written as the plain loops a reader checks the kernels against (rows, heads,
// splits, masks), not factored. NOLINTBEGIN(readability-function-cognitive-complexity)
template <class Keys>
void attend(const QueryBatch& q, const void* k_base, const void* v_base, Shape s, const AttentionOptions& opt,
            std::uint32_t num_splits, bool prefill, Keys keys) {
  // NOLINTEND(readability-function-cognitive-complexity)
  const std::uint32_t d = s.head_dim;
  const std::uint32_t group = q.q_heads / s.kv_heads;
  const double scale = opt.scale > 0.0f ? double{opt.scale} : 1.0 / std::sqrt(double(d));
  const double cap = opt.soft_cap;
  const std::uint64_t elt = dtype_bytes(s.dtype);
  // Every request is checked before anything is written.
  for (std::uint32_t b = 0; b < q.batch; ++b) {
    const std::uint32_t r0 = prefill ? q.q_indptr[b] : b;
    const std::uint32_t r1 = prefill ? q.q_indptr[b + 1] : b + 1;
    if (r1 < r0 || r1 > q.rows)
      fail("query.q_indptr[{}] = {}: rows of request {} must lie in [q_indptr[{}] = {}, rows = {}]", b + 1, r1, b, b,
           r0, q.rows);
    if (r1 - r0 > q.kv_lens[b])
      fail("query.kv_lens[{}] = {}: fewer than its {} query tokens", b, q.kv_lens[b], r1 - r0);
    keys.select(b);
    keys.check_len(q.kv_lens[b]);
  }
  std::vector<double> qv(d), acc(d), out(d);
  for (std::uint32_t b = 0; b < q.batch; ++b) {
    const std::uint32_t r0 = prefill ? q.q_indptr[b] : b;
    const std::uint32_t r1 = prefill ? q.q_indptr[b + 1] : b + 1;
    const std::uint32_t kv_len = q.kv_lens[b];
    const std::uint32_t q_len = r1 - r0;
    keys.select(b);
    for (std::uint32_t row = r0; row < r1; ++row) {
      const std::uint32_t q_pos = kv_len - q_len + (row - r0);
      const KeyRange range = key_range(opt.mask, opt.window, opt.chunk, q_pos);
      for (std::uint32_t hq = 0; hq < q.q_heads; ++hq) {
        const std::uint32_t h = hq / group;
        const std::uint64_t q_off = (std::uint64_t{row} * q.q_heads + hq) * d;
        for (std::uint32_t j = 0; j < d; ++j) qv[j] = to_float(s.dtype, load16(q.q, (q_off + j) * elt));
        // Per split: (max logit, sum of exp, normalised output); then the merge.
        double big_m = -std::numeric_limits<double>::infinity();
        double big_l = 0.0;
        std::fill(out.begin(), out.end(), 0.0);
        for (std::uint32_t sp = 0; sp < num_splits; ++sp) {
          const KeyRange piece = split_range(range, sp, num_splits);
          SoftmaxState<double> st{-std::numeric_limits<double>::infinity(), 0.0};
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::uint32_t tok = piece.lo; tok < piece.hi; ++tok) {
            const std::int64_t off = keys.offset(tok);
            if (off < 0) continue;
            const std::uint64_t head_off = static_cast<std::uint64_t>(off) + std::uint64_t{h} * keys.head_stride();
            double logit = 0.0;
            for (std::uint32_t j = 0; j < d; ++j)
              logit += qv[j] * to_float(s.dtype, load16(k_base, head_off + j * elt));
            logit *= scale;
            if (cap > 0.0) logit = cap * std::tanh(logit / cap);
            const double m_new = std::max(st.m, logit);
            const double pr = std::exp(logit - m_new);
            const double corr = softmax_absorb(st, m_new, pr, Exp{});
            for (std::uint32_t j = 0; j < d; ++j)
              acc[j] = acc[j] * corr + pr * to_float(s.dtype, load16(v_base, head_off + j * elt));
          }
          if (st.l == 0.0) continue;  // empty piece: weight 0 in the merge
          const double m_new = std::max(big_m, st.m);
          const double w_old = big_l * softmax_weight(SoftmaxState<double>{big_m, big_l}, m_new, Exp{});
          const double w_new = st.l * softmax_weight(st, m_new, Exp{});
          for (std::uint32_t j = 0; j < d; ++j) out[j] = (out[j] * w_old + acc[j] / st.l * w_new) / (w_old + w_new);
          big_l = w_old + w_new;
          big_m = m_new;
        }
        for (std::uint32_t j = 0; j < d; ++j) {
          const std::uint16_t v = from_float(s.dtype, static_cast<float>(out[j]));
          std::memcpy(static_cast<char*>(q.o) + (q_off + j) * elt, &v, sizeof v);
        }
      }
    }
  }
}

void paged(const PagedAttentionParams& p, bool prefill) {
  check_params(p, prefill, false);
  if (p.query.rows == 0) return;
  attend(p.query, p.cache.k, p.cache.v, Shape{p.cache.kv_heads, p.cache.head_dim, p.cache.dtype}, p.options,
         p.split.num_splits, prefill, PagedKeys(p));
}

void contiguous(const ContiguousAttentionParams& p, bool prefill) {
  check_params(p, prefill, false);
  if (p.query.rows == 0) return;
  attend(p.query, p.cache.k, p.cache.v, Shape{p.cache.kv_heads, p.cache.head_dim, p.cache.dtype}, p.options,
         p.split.num_splits, prefill, ContiguousKeys(p));
}

}  // namespace

namespace cpu {
void paged_decode_attention(const PagedAttentionParams& p) { paged(p, false); }
void paged_prefill_attention(const PagedAttentionParams& p) { paged(p, true); }
void contiguous_decode_attention(const ContiguousAttentionParams& p) { contiguous(p, false); }
void contiguous_prefill_attention(const ContiguousAttentionParams& p) { contiguous(p, true); }
}  // namespace cpu

}  // namespace kvmm::kernels
