// Test fixture shared by tests/kernels (CPU references) and tests/gpu (kernels): one
// random attention scenario on the host (queries, per-request context, a page-layer
// arena with permuted, over-allocated page tables and null pages, a contiguous cache
// with permuted slots) and a naive dense attention in double as the oracle.
#pragma once

#include <kvmm/kernels/attention.hpp>
#include <kvmm/kernels/cache_ops.hpp>
#include <kvmm/paging/page_table.hpp>
#include <kvmm/spec/kv_layout.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvmm::test {

using namespace kvmm::kernels;

struct alignas(16) Block16 {
  unsigned char bytes[16];
};

// 16-byte aligned byte buffer.
struct Buffer {
  std::vector<Block16> blocks;
  void resize(std::size_t bytes) { blocks.assign((bytes + 15) / 16, Block16{}); }
  void* data() { return blocks.data(); }
  std::size_t size() const { return blocks.size() * 16; }
};

enum class NullMode { kNone, kOutOfWindow, kRandom };

struct ScenarioConfig {
  DType dtype = DType::kF16;
  std::uint32_t head_dim = 64;
  std::uint32_t kv_heads = 2;
  std::uint32_t group = 1;  // query heads per kv head
  std::uint32_t tokens_per_page = 16;
  std::uint32_t batch = 3;
  std::uint32_t max_kv_len = 70;
  bool prefill = false;
  std::uint32_t max_q_len = 8;
  AttentionOptions options;
  bool csr = true;
  NullMode nulls = NullMode::kNone;
  std::uint64_t seed = 1;
  KVOrder order = KVOrder::kTokenMajor;  // of both caches (the values and pages do not depend on it)
};

// Independent statement of the masks (not kvmm's key_range): may query q_pos see key k?
inline bool visible(const AttentionOptions& o, std::uint32_t q_pos, std::uint32_t k) {
  if (k > q_pos) return false;
  if (o.mask == MaskKind::kSlidingWindow) return q_pos - k < o.window;
  if (o.mask == MaskKind::kChunkedLocal) return k / o.chunk == q_pos / o.chunk;
  return true;
}

// Naive dense attention in double: two-pass softmax over every visible key that is not
// in a null page. Per request b: k_tok[b], v_tok[b] are [kv_lens[b], kv_heads, head_dim];
// its query rows are q_indptr[b] .. q_indptr[b+1] at the last positions of its context.
inline std::vector<double> naive_attention(DType dtype, std::uint32_t d, std::uint32_t kv_heads, std::uint32_t q_heads,
                                           const AttentionOptions& o, const std::vector<std::uint16_t>& q,
                                           const std::vector<std::uint32_t>& kv_lens,
                                           const std::vector<std::uint32_t>& q_indptr,
                                           const std::vector<std::vector<std::uint16_t>>& k_tok,
                                           const std::vector<std::vector<std::uint16_t>>& v_tok,
                                           const std::vector<std::vector<bool>>& token_null) {
  const std::uint32_t group = q_heads / kv_heads;
  const double scale = o.scale > 0.0f ? double{o.scale} : 1.0 / std::sqrt(double(d));
  const std::uint32_t batch = static_cast<std::uint32_t>(kv_lens.size());
  std::vector<double> out(std::size_t{q_indptr[batch]} * q_heads * d, 0.0);
  std::vector<double> logits;
  for (std::uint32_t b = 0; b < batch; ++b) {
    const std::uint32_t q_len = q_indptr[b + 1] - q_indptr[b];
    for (std::uint32_t i = 0; i < q_len; ++i) {
      const std::uint32_t row = q_indptr[b] + i;
      const std::uint32_t q_pos = kv_lens[b] - q_len + i;
      for (std::uint32_t hq = 0; hq < q_heads; ++hq) {
        const std::uint32_t h = hq / group;
        const std::uint16_t* qr = &q[(std::size_t{row} * q_heads + hq) * d];
        logits.assign(kv_lens[b], -INFINITY);
        double mx = -INFINITY;
        for (std::uint32_t k = 0; k < kv_lens[b]; ++k) {
          if (!visible(o, q_pos, k) || (!token_null.empty() && token_null[b][k])) continue;
          const std::uint16_t* kr = &k_tok[b][(std::size_t{k} * kv_heads + h) * d];
          double s = 0.0;
          for (std::uint32_t j = 0; j < d; ++j) s += double(to_float(dtype, qr[j])) * to_float(dtype, kr[j]);
          s *= scale;
          if (o.soft_cap > 0.0f) s = o.soft_cap * std::tanh(s / o.soft_cap);
          logits[k] = s;
          mx = std::max(mx, s);
        }
        if (mx == -INFINITY) continue;  // no visible key: output 0
        double sum = 0.0;
        double* dst = &out[(std::size_t{row} * q_heads + hq) * d];
        for (std::uint32_t k = 0; k < kv_lens[b]; ++k) {
          if (logits[k] == -INFINITY) continue;
          const double p = std::exp(logits[k] - mx);
          sum += p;
          const std::uint16_t* vr = &v_tok[b][(std::size_t{k} * kv_heads + h) * d];
          for (std::uint32_t j = 0; j < d; ++j) dst[j] += p * to_float(dtype, vr[j]);
        }
        for (std::uint32_t j = 0; j < d; ++j) dst[j] /= sum;
      }
    }
  }
  return out;
}

struct Scenario {
  ScenarioConfig cfg;
  std::uint32_t q_heads = 0;
  std::uint32_t rows = 0;
  std::vector<std::uint32_t> kv_lens, q_indptr;
  std::vector<std::uint16_t> q;                          // [rows, q_heads, head_dim]
  std::vector<std::vector<std::uint16_t>> k_tok, v_tok;  // per request [kv_len, kv_heads, head_dim]
  std::vector<std::vector<bool>> token_null;             // per request: token sits in a null page
  bool any_null = false;
  // Paged side: page-layer arena of 2 layers, layer 1 used, page stride padded by 48 bytes.
  std::uint64_t page_stride = 0, k_off = 0, v_off = 0;
  std::uint32_t num_pages = 0;
  Buffer arena;
  std::vector<std::vector<PageId>> rows_pages;  // per request, over-allocated, with nulls
  std::vector<std::uint32_t> csr_indptr, csr_last;
  std::vector<PageId> csr_indices, dense;
  std::uint32_t dense_stride = 0;
  // Contiguous side.
  std::uint32_t max_ctx = 0, num_slots = 0;
  std::uint64_t slot_stride = 0;
  Buffer cont_k, cont_v;
  std::vector<std::uint32_t> slot_idx;

  std::uint64_t row_bytes() const { return token_row_bytes(cfg.kv_heads, cfg.head_dim, cfg.dtype); }
  std::size_t out_elems() const { return std::size_t{rows} * q_heads * cfg.head_dim; }

  explicit Scenario(const ScenarioConfig& c) : cfg(c) {
    std::mt19937_64 rng(c.seed);
    auto uni = [&](std::uint32_t lo, std::uint32_t hi) {  // inclusive
      return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng);
    };
    std::uniform_real_distribution<float> val(-1.0f, 1.0f);
    q_heads = c.kv_heads * c.group;
    const std::uint32_t d = c.head_dim;
    kv_lens.resize(c.batch);
    q_indptr.assign(c.batch + 1, 0);
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      kv_lens[b] = uni(1, c.max_kv_len);
      const std::uint32_t q_len = c.prefill ? uni(1, std::min(kv_lens[b], c.max_q_len)) : 1;
      q_indptr[b + 1] = q_indptr[b] + q_len;
    }
    rows = q_indptr[c.batch];
    // Scale queries so that logits spread (soft-capping and softmax both matter).
    q.resize(out_elems());
    for (auto& x : q) x = from_float(c.dtype, 2.0f * val(rng));
    const std::uint64_t tok_elems = std::uint64_t{c.kv_heads} * d;
    k_tok.resize(c.batch);
    v_tok.resize(c.batch);
    token_null.resize(c.batch);
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      k_tok[b].resize(kv_lens[b] * tok_elems);
      v_tok[b].resize(kv_lens[b] * tok_elems);
      for (auto& x : k_tok[b]) x = from_float(c.dtype, val(rng));
      for (auto& x : v_tok[b]) x = from_float(c.dtype, val(rng));
    }

    // Page-layer layout from kvmm's own planner.
    const KVLayout layout =
        KVLayout::plan({LayerGroup::full_attention("g", 2, c.kv_heads, d, dtype_bytes(c.dtype), c.tokens_per_page)});
    page_stride = layout.small_page_bytes(0) + 48;
    k_off = layout.k_offset(0, 1);
    v_off = layout.v_offset(0, 1);
    std::uint32_t total = 0;
    std::vector<std::uint32_t> alloc(c.batch);
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      alloc[b] = (kv_lens[b] + c.tokens_per_page - 1) / c.tokens_per_page + uni(0, 2);
      total += alloc[b];
    }
    num_pages = total + 5;
    std::vector<PageId> perm(num_pages);
    std::iota(perm.begin(), perm.end(), PageId{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    arena.resize(num_pages * page_stride);
    for (std::size_t i = 0; i < arena.size(); ++i)
      reinterpret_cast<unsigned char*>(arena.data())[i] = 0x7b;  // NaN-ish poison
    rows_pages.resize(c.batch);
    std::uint32_t next = 0;
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      const std::uint32_t q_len = q_indptr[b + 1] - q_indptr[b];
      const std::uint32_t lo = key_lo(kv_lens[b] - q_len);
      token_null[b].assign(kv_lens[b], false);
      for (std::uint32_t i = 0; i < alloc[b]; ++i) {
        PageId page = perm[next++];
        const std::uint64_t first = std::uint64_t{i} * c.tokens_per_page;
        const std::uint64_t last = first + c.tokens_per_page;  // exclusive
        const bool used = first < kv_lens[b];
        bool make_null = false;
        if (used && c.nulls == NullMode::kOutOfWindow) make_null = last <= lo;
        if (used && c.nulls == NullMode::kRandom) make_null = uni(0, 3) == 0;
        if (make_null) {
          page = kNullPage;
          any_null = true;
          for (std::uint64_t t = first; t < std::min<std::uint64_t>(last, kv_lens[b]); ++t) token_null[b][t] = true;
        }
        rows_pages[b].push_back(page);
      }
    }
    // Tables through kvmm's PageTableSet exports.
    PageTableSet tables(c.batch, c.tokens_per_page);
    std::vector<Row> ids(c.batch);
    for (std::uint32_t b = 0; b < c.batch; ++b) {
      ids[b] = Row{b};
      for (PageId pg : rows_pages[b]) tables.append(ids[b], pg);
      tables.set_num_tokens(ids[b], kv_lens[b]);
    }
    csr_indptr.resize(c.batch + 1);
    csr_indices.resize(total);
    csr_last.resize(c.batch);
    tables.export_csr(ids, csr_indptr, csr_indices, csr_last);
    dense_stride = 0;
    for (std::uint32_t b = 0; b < c.batch; ++b) dense_stride = std::max<std::uint32_t>(dense_stride, alloc[b] + 1);
    dense.resize(std::size_t{c.batch} * dense_stride);
    tables.export_dense(ids, dense, dense_stride);

    // Contiguous cache: permuted slots, padded slot stride.
    max_ctx = c.max_kv_len + 3;
    num_slots = c.batch + 2;
    slot_stride = max_ctx * row_bytes() + 32;
    cont_k.resize(num_slots * slot_stride);
    cont_v.resize(num_slots * slot_stride);
    std::vector<std::uint32_t> slots(num_slots);
    std::iota(slots.begin(), slots.end(), 0u);
    std::shuffle(slots.begin(), slots.end(), rng);
    slot_idx.assign(slots.begin(), slots.begin() + c.batch);
  }

  // Smallest key any query of a request starting at position p0 sees.
  std::uint32_t key_lo(std::uint32_t p0) const {
    const AttentionOptions& o = cfg.options;
    if (o.mask == MaskKind::kSlidingWindow) return p0 + 1 > o.window ? p0 + 1 - o.window : 0;
    if (o.mask == MaskKind::kChunkedLocal) return p0 / o.chunk * o.chunk;
    return 0;
  }

  PagedKVCache paged_cache(void* arena_base) const {
    return PagedKVCache{static_cast<char*>(arena_base) + k_off,
                        static_cast<char*>(arena_base) + v_off,
                        page_stride,
                        cfg.tokens_per_page,
                        cfg.kv_heads,
                        cfg.head_dim,
                        cfg.dtype,
                        cfg.order};
  }
  ContiguousKVCache contiguous_cache(void* k, void* v) const {
    return ContiguousKVCache{k, v, slot_stride, max_ctx, cfg.kv_heads, cfg.head_dim, cfg.dtype, cfg.order};
  }

  // Flattened new-token arrays of every request's whole context (what write_kv stores).
  struct Writes {
    std::vector<std::uint16_t> k, v;
    std::vector<PageId> page_ids;
    std::vector<std::uint32_t> offsets, slots, positions;
  };
  Writes writes() const {
    Writes w;
    for (std::uint32_t b = 0; b < cfg.batch; ++b) {
      w.k.insert(w.k.end(), k_tok[b].begin(), k_tok[b].end());
      w.v.insert(w.v.end(), v_tok[b].begin(), v_tok[b].end());
      for (std::uint32_t t = 0; t < kv_lens[b]; ++t) {
        w.page_ids.push_back(rows_pages[b][t / cfg.tokens_per_page]);  // kNullPage: skipped
        w.offsets.push_back(t % cfg.tokens_per_page);
        w.slots.push_back(slot_idx[b]);
        w.positions.push_back(t);
      }
    }
    return w;
  }

  // Fills both caches on the host with the CPU write_kv references.
  void fill_host_caches() {
    const Writes w = writes();
    const auto n = static_cast<std::uint32_t>(w.page_ids.size());
    cpu::write_kv(
        PagedWriteParams{paged_cache(arena.data()), w.k.data(), w.v.data(), w.page_ids.data(), w.offsets.data(), n});
    cpu::write_kv(ContiguousWriteParams{contiguous_cache(cont_k.data(), cont_v.data()), w.k.data(), w.v.data(),
                                        w.slots.data(), w.positions.data(), n});
  }

  QueryBatch query(const void* q_ptr, void* o, const std::uint32_t* lens, const std::uint32_t* indptr) const {
    return QueryBatch{q_ptr, o, rows, cfg.batch, q_heads, lens, cfg.prefill ? indptr : nullptr};
  }

  // Host parameter sets (host pointers).
  PagedAttentionParams paged_params(void* o, std::uint32_t splits, bool use_csr) {
    PagedAttentionParams p;
    p.query = query(q.data(), o, kv_lens.data(), q_indptr.data());
    p.cache = paged_cache(arena.data());
    p.table = use_csr ? PageTableView{csr_indptr.data(), csr_indices.data(), 0}
                      : PageTableView{nullptr, dense.data(), dense_stride};
    p.options = cfg.options;
    p.split.num_splits = splits;
    return p;
  }
  ContiguousAttentionParams contiguous_params(void* o, std::uint32_t splits) {
    ContiguousAttentionParams p;
    p.query = query(q.data(), o, kv_lens.data(), q_indptr.data());
    p.cache = contiguous_cache(cont_k.data(), cont_v.data());
    p.slot_idx = slot_idx.data();
    p.options = cfg.options;
    p.split.num_splits = splits;
    return p;
  }

  std::vector<double> naive() const {
    return naive_attention(cfg.dtype, cfg.head_dim, cfg.kv_heads, q_heads, cfg.options, q, kv_lens, q_indptr, k_tok,
                           v_tok, token_null);
  }
};

// Largest |got - want| / (|want| + floor) over all elements: the error in units of the
// dtype's relative precision is what tests bound.
inline double max_rel_error(DType t, const std::vector<std::uint16_t>& got, const std::vector<double>& want,
                            double floor) {
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = to_float(t, got[i]);
    const double e = std::abs(g - want[i]) / (std::abs(want[i]) + floor);
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

// Unit roundoff of a storage type (half an ulp at 1.0).
// One layer group of an engine-loop test: the layer attended, its mask, q heads, and every
// request's K/V so far held contiguously (what naive_attention compares against).
struct EngineGroup {
  GroupId id;
  std::uint32_t layer;
  AttentionOptions options;
  std::uint32_t q_heads;
  std::vector<std::vector<std::uint16_t>> k_tok, v_tok;  // per request, every token so far
};

// Writes random K/V for a step's new tokens (request b's are rows q_indptr[b] .. and start
// at position lens[b]) through the slot mapping into the pages page_of(b, pos) names, and
// appends them to g's contiguous copies.
template <class PageOf>
void write_step_kv(EngineGroup& g, const PagedKVCache& cache, const std::vector<std::uint32_t>& q_indptr,
                   const std::vector<std::uint32_t>& lens, std::mt19937_64& rng, PageOf page_of) {
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  const std::uint32_t batch = static_cast<std::uint32_t>(lens.size()), rows = q_indptr[batch];
  const std::size_t row_elems = std::size_t{cache.kv_heads} * cache.head_dim;
  std::vector<std::uint16_t> k_new(rows * row_elems), v_new(rows * row_elems);
  std::vector<PageId> page_ids(rows);
  std::vector<std::uint32_t> offsets(rows);
  for (std::uint32_t b = 0; b < batch; ++b)
    for (std::uint32_t i = q_indptr[b]; i < q_indptr[b + 1]; ++i) {
      const std::uint32_t pos = lens[b] + (i - q_indptr[b]);
      page_ids[i] = page_of(b, pos);
      offsets[i] = pos % cache.tokens_per_page;
      for (std::size_t e = 0; e < row_elems; ++e) {
        k_new[i * row_elems + e] = from_float(cache.dtype, val(rng));
        v_new[i * row_elems + e] = from_float(cache.dtype, val(rng));
      }
      g.k_tok[b].insert(g.k_tok[b].end(), k_new.begin() + i * row_elems, k_new.begin() + (i + 1) * row_elems);
      g.v_tok[b].insert(g.v_tok[b].end(), v_new.begin() + i * row_elems, v_new.begin() + (i + 1) * row_elems);
    }
  cpu::write_kv(PagedWriteParams{cache, k_new.data(), v_new.data(), page_ids.data(), offsets.data(), rows});
}

inline double unit_roundoff(DType t) { return t == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }

// Stored fp16/bf16 outputs as doubles, for max_rel_error against a reference.
inline std::vector<double> widen(DType t, const std::vector<std::uint16_t>& x) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_float(t, x[i]);
  return out;
}

}  // namespace kvmm::test
