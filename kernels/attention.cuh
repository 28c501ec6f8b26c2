// The attention kernel template behind all four launchers, and its split-KV merge.
// One CTA = (query row, kv head, up to G query heads of its GQA group, split); G is 4
// (decode, groups of 1 to 4) or 8 (larger groups, several CTAs when over 8; prefill).
// In prefill a CTA takes G / group consecutive rows of one request when the group is
// smaller than G, so those rows share each K/V load too ("slots" = row x head pairs).
// Threads form teams of head_dim/8: a team streams one token's K and V row (16 bytes
// per thread) and applies it to every query head of the CTA, so K/V are read once per
// GQA group; each team keeps an online softmax state per head, kTile tokens in flight.
// Teams merge in shared memory; split pieces merge in merge_kernel. Device code only:
// the launch configuration and dispatch are in attention_dispatch.cuh.
#pragma once

#include "common.cuh"

#include <cmath>

namespace kvmm::kernels::device {

inline constexpr int kThreads = 128;
inline constexpr int kTile = 4;
inline constexpr float kLog2e = 1.4426950408889634f;

// The exponential of the kernels' base-2 logits, for the shared online softmax.
struct Exp2 {
  __host__ __device__ __forceinline__ float operator()(float x) const { return exp2f(x); }
};

struct AttnArgs {
  const std::uint16_t* q;
  std::uint16_t* o;
  float* ws_o;    // [rows, q_heads, num_splits, head_dim] when num_splits > 1
  float* ws_lse;  // [rows, q_heads, num_splits], log2 domain
  // The tensor-core decode's in-kernel split merge (tc_decode.cuh): one arrival counter
  // per (row, kv head x head chunk), zero between launches; nullptr: merge_kernel merges.
  std::uint32_t* merge_counters;
  const std::uint32_t* kv_lens;
  const std::uint32_t* q_indptr;  // nullptr: decode
  std::uint32_t batch;
  std::uint32_t q_heads;
  std::uint32_t group;
  std::uint32_t head_chunks;
  std::uint32_t rows_per_cta;  // prefill: rows of one request per CTA; decode: 1
  std::uint32_t num_splits;
  MaskKind mask;
  std::uint32_t window;
  std::uint32_t chunk;
  float scale_log2;     // no soft cap: logit2 = dot * scale_log2
  float scale_div_cap;  // soft cap: logit2 = cap_log2 * tanh(dot * scale_div_cap)
  float cap_log2;
  bool soft_cap;
  // The tensor-core decode's grid order (tc_decode.cuh, its swapped form only): false,
  // (request, kv head x head chunk, split) as blockIdx (x, y, z); true, (kv head x head
  // chunk, request, split), so the CTAs of one request's kv heads, which read the same
  // token rows, are adjacent.
  bool heads_first;
};

// Paged addressing: byte offset of (token, kv head 0) from the layer's K/V base, or -1
// for a token in a null page; kv head h lies head_stride x h further (kv_strides: row_bytes
// is the token stride of the cache's order; both below 2^32, check_params).
struct PagedAddr {
  const char* k;
  const char* v;
  std::uint64_t page_stride;
  std::uint32_t tokens_per_page;
  std::uint32_t row_bytes;
  const std::uint32_t* indptr;
  const std::uint32_t* pages;
  std::uint32_t dense_stride;
  std::uint32_t head_stride;

  struct Row {
    const std::uint32_t* pages;
  };
  __device__ __forceinline__ Row row(std::uint32_t b) const {
    return Row{indptr != nullptr ? pages + __ldg(indptr + b) : pages + std::uint64_t{b} * dense_stride};
  }
  __device__ __forceinline__ long long offset(const Row& r, std::uint32_t tok) const {
    const std::uint32_t page = __ldg(r.pages + page_of_token(tok, tokens_per_page));
    return paged_token_offset(page, tok, tokens_per_page, page_stride, row_bytes);
  }
};

// Contiguous addressing: slot base + token * row (row_bytes: the token stride of the
// cache's order); kv head h lies head_stride x h further.
struct ContiguousAddr {
  const char* k;
  const char* v;
  std::uint64_t slot_stride;
  std::uint32_t row_bytes;
  std::uint32_t head_stride;
  const std::uint32_t* slot_idx;

  struct Row {
    std::uint64_t base;
  };
  __device__ __forceinline__ Row row(std::uint32_t b) const { return Row{__ldg(slot_idx + b) * slot_stride}; }
  __device__ __forceinline__ long long offset(const Row& r, std::uint32_t tok) const {
    return slot_row_offset(r.base, 1, tok, row_bytes);  // base: the slot's offset, formed once per CTA
  }
};

// The addressing of a launch's cache (host): its pointers, page or slot stride and the
// two strides of its order (kv_strides).
inline PagedAddr paged_addr(const PagedAttentionParams& p) {
  const KVStrides st = kv_strides(p.cache);
  return PagedAddr{static_cast<const char*>(p.cache.k),
                   static_cast<const char*>(p.cache.v),
                   p.cache.page_stride_bytes,
                   p.cache.tokens_per_page,
                   static_cast<std::uint32_t>(st.token),
                   p.table.indptr,
                   p.table.pages,
                   p.table.dense_stride,
                   static_cast<std::uint32_t>(st.head)};
}
inline ContiguousAddr contiguous_addr(const ContiguousAttentionParams& p) {
  const KVStrides st = kv_strides(p.cache);
  return ContiguousAddr{static_cast<const char*>(p.cache.k), static_cast<const char*>(p.cache.v),
                        p.cache.slot_stride_bytes,           static_cast<std::uint32_t>(st.token),
                        static_cast<std::uint32_t>(st.head), p.slot_idx};
}

template <typename T, int D, int kMaxGroup, typename Addr>
__global__ void __launch_bounds__(kThreads, kMaxGroup == 4 ? 4 : 2) attention_kernel(AttnArgs a, Addr kv) {
  constexpr int kTeam = D / 8;  // threads per token row: 8, 16 or 32 (within one warp)
  constexpr int kTeams = kThreads / kTeam;
  struct alignas(16) Smem {  // the teams' softmax states, merged at the end
    float o[kTeams][kMaxGroup][D];
    float m[kTeams][kMaxGroup];
    float l[kTeams][kMaxGroup];
  };
  __shared__ Smem sm;

  const std::uint32_t row = blockIdx.x;
  std::uint32_t b = row, q_len = 1, i = 0;
  if (a.q_indptr != nullptr) {
    if (row >= __ldg(a.q_indptr + a.batch)) return;  // whole CTA: rows past the last request
    std::uint32_t lo = 0, hi = a.batch;              // q_indptr[lo] <= row < q_indptr[hi]
    while (hi - lo > 1) {
      const std::uint32_t mid = (lo + hi) / 2;
      if (__ldg(a.q_indptr + mid) <= row)
        lo = mid;
      else
        hi = mid;
    }
    b = lo;
    q_len = __ldg(a.q_indptr + b + 1) - __ldg(a.q_indptr + b);
    i = row - __ldg(a.q_indptr + b);
    if (i % a.rows_per_cta != 0) return;  // whole CTA: its row belongs to an earlier CTA's tile
  }
  const std::uint32_t kv_len = __ldg(a.kv_lens + b);
  const std::uint32_t h = blockIdx.y / a.head_chunks;
  const std::uint32_t g0 = (blockIdx.y % a.head_chunks) * kMaxGroup;
  // Slot j of the CTA: row `row + j / hg`, query head `qh0 + j % hg`.
  const std::uint32_t hg = min(static_cast<std::uint32_t>(kMaxGroup), a.group - g0);
  const std::uint32_t nrows = min(a.rows_per_cta, q_len - i);
  const int ng = static_cast<int>(hg * nrows);
  const std::uint32_t qh0 = h * a.group + g0;
  const std::uint32_t split = blockIdx.z;
  // Each slot's visible keys; the CTA walks (its piece of) their union. Only the G = 8
  // kernel serves prefill row tiles; the G = 4 one (decode) has one row and no slot masks.
  constexpr bool kRowTiles = kMaxGroup == 8;
  constexpr int kMasks = kRowTiles ? kMaxGroup : 1;
  std::uint32_t slot_lo[kMasks], slot_hi[kMasks];
  KeyRange all{0xffffffffu, 0};
  KVMM_UNROLL
  for (int g = 0; g < kMasks; ++g) {
    slot_lo[g] = 0;
    slot_hi[g] = 0;
    if (g < ng && q_len <= kv_len) {
      const KeyRange kr = key_range(a.mask, a.window, a.chunk, kv_len - q_len + i + g / hg);
      slot_lo[g] = kr.lo;
      slot_hi[g] = kr.hi;
      all.lo = min(all.lo, kr.lo);
      all.hi = max(all.hi, kr.hi);
    }
  }
  const KeyRange piece = all.lo < all.hi ? split_range(all, split, a.num_splits) : KeyRange{0, 0};

  const int team = static_cast<int>(threadIdx.x) / kTeam;
  const int lane = static_cast<int>(threadIdx.x) % kTeam;
  float qf[kMaxGroup][8];
  SoftmaxState<float> st[kMaxGroup];
  float acc[kMaxGroup][8];
  KVMM_UNROLL
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < ng) {
      const std::uint64_t slot_head = std::uint64_t{row + g / hg} * a.q_heads + qh0 + g % hg;
      const uint4 u = ldg16(a.q + slot_head * D + lane * 8);
      to_float8<T>(u, qf[g]);
    } else {
      KVMM_UNROLL
      for (int j = 0; j < 8; ++j) qf[g][j] = 0.0f;
    }
    st[g] = SoftmaxState<float>{-INFINITY, 0.0f};
    KVMM_UNROLL
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
  }

  const typename Addr::Row r = kv.row(b);
  const std::uint64_t head_off = std::uint64_t{h} * kv.head_stride + std::uint64_t(lane) * 16;
  // Every team runs the same number of iterations, so the team shuffles below always
  // see a full warp.
  for (std::uint32_t base0 = piece.lo; base0 < piece.hi; base0 += kTeams * kTile) {
    const std::uint32_t base = base0 + static_cast<std::uint32_t>(team) * kTile;
    uint4 kr[kTile], vr[kTile];
    bool ok[kTile];
    KVMM_UNROLL
    for (int t = 0; t < kTile; ++t) {
      const std::uint32_t tok = base + t;
      const long long off = tok < piece.hi ? kv.offset(r, tok) : -1;
      ok[t] = off >= 0;
      kr[t] = ldg16_if(kv.k + off + head_off, ok[t]);
      vr[t] = ldg16_if(kv.v + off + head_off, ok[t]);
    }
    float s[kTile][kMaxGroup];
    KVMM_UNROLL
    for (int t = 0; t < kTile; ++t) {
      float kf[8];
      to_float8<T>(kr[t], kf);
      KVMM_UNROLL
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < ng) {
          float dot = 0.0f;
          KVMM_UNROLL
          for (int j = 0; j < 8; ++j) dot = fmaf(qf[g][j], kf[j], dot);
          KVMM_UNROLL
          for (int off = kTeam / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
#if defined(KVMM_CENSUS_NO_SOFT_CAP)
          constexpr bool soft_cap = false;  // census builds: the benchmarks' path, without the tanh branch
#else
          const bool soft_cap = a.soft_cap;
#endif
          const float logit = soft_cap ? a.cap_log2 * tanhf(dot * a.scale_div_cap) : dot * a.scale_log2;
          bool visible = ok[t];
          if constexpr (kRowTiles) {
            const std::uint32_t tok = base + t;
            visible = visible && tok >= slot_lo[g] && tok < slot_hi[g];
          }
          s[t][g] = visible ? logit : -INFINITY;
        } else {
          s[t][g] = -INFINITY;
        }
      }
    }
    // Online softmax over the tile: s becomes the tile's probabilities.
    KVMM_UNROLL
    for (int g = 0; g < kMaxGroup; ++g) {
      float mt = st[g].m;
      KVMM_UNROLL
      for (int t = 0; t < kTile; ++t) mt = fmaxf(mt, s[t][g]);
      if (mt == -INFINITY) {
        KVMM_UNROLL
        for (int t = 0; t < kTile; ++t) s[t][g] = 0.0f;
        continue;
      }
      float sum = 0.0f;
      KVMM_UNROLL
      for (int t = 0; t < kTile; ++t) {
        s[t][g] = exp2f(s[t][g] - mt);
        sum += s[t][g];
      }
      const float corr = softmax_absorb(st[g], mt, sum, Exp2{});
      KVMM_UNROLL
      for (int j = 0; j < 8; ++j) acc[g][j] *= corr;
    }
    KVMM_UNROLL
    for (int t = 0; t < kTile; ++t) {
      float vf[8];
      to_float8<T>(vr[t], vf);
      KVMM_UNROLL
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < ng) {
          KVMM_UNROLL
          for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(s[t][g], vf[j], acc[g][j]);
        }
      }
    }
  }

  // Merge the teams' states in shared memory.
  KVMM_UNROLL
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < ng) {
      if (lane == 0) {
        sm.m[team][g] = st[g].m;
        sm.l[team][g] = st[g].l;
      }
      float4* dst = reinterpret_cast<float4*>(&sm.o[team][g][lane * 8]);
      dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    }
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < ng * D; idx += kThreads) {
    const int g = idx / D;
    const int d = idx % D;
    float big_m = -INFINITY;
    KVMM_UNROLL
    for (int t = 0; t < kTeams; ++t) big_m = fmaxf(big_m, sm.m[t][g]);
    float big_l = 0.0f, out = 0.0f;
    if (big_m != -INFINITY) {
      KVMM_UNROLL
      for (int t = 0; t < kTeams; ++t) {
        const float w = softmax_weight(SoftmaxState<float>{sm.m[t][g], sm.l[t][g]}, big_m, Exp2{});
        big_l = fmaf(sm.l[t][g], w, big_l);
        out = fmaf(sm.o[t][g][d], w, out);
      }
    }
    const float value = big_l > 0.0f ? out / big_l : 0.0f;
    const std::uint64_t head = std::uint64_t{row + g / hg} * a.q_heads + qh0 + g % hg;
    if (a.num_splits == 1) {
      a.o[head * D + d] = T::from_float(value);
    } else {
      a.ws_o[(head * a.num_splits + split) * D + d] = value;
      if (d == 0) a.ws_lse[head * a.num_splits + split] = big_l > 0.0f ? big_m + log2f(big_l) : -INFINITY;
    }
  }
}

// One CTA per (row, query head), one thread per output element: weights 2^(lse - max).
template <typename T>
__global__ void merge_kernel(AttnArgs a, std::uint32_t head_dim) {
  const std::uint32_t row = blockIdx.x;
  if (a.q_indptr != nullptr && row >= __ldg(a.q_indptr + a.batch)) return;
  const std::uint64_t head = std::uint64_t{row} * a.q_heads + blockIdx.y;
  const std::uint32_t d = threadIdx.x;
  const float* lse = a.ws_lse + head * a.num_splits;
  float big = -INFINITY;
  for (std::uint32_t s = 0; s < a.num_splits; ++s) big = fmaxf(big, lse[s]);
  float weight = 0.0f, out = 0.0f;
  if (big != -INFINITY) {
    for (std::uint32_t s = 0; s < a.num_splits; ++s) {
      const float w = softmax_weight(SoftmaxState<float>{lse[s], 1.0f}, big, Exp2{});  // lse = m + log2 l
      weight += w;
      out = fmaf(w, a.ws_o[(head * a.num_splits + s) * head_dim + d], out);
    }
  }
  a.o[head * head_dim + d] = T::from_float(weight > 0.0f ? out / weight : 0.0f);
}

}  // namespace kvmm::kernels::device
