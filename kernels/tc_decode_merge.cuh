// The tensor-core decode's merges (tc_decode.cuh, issue 36): of a CTA's warps at its end
// (tc_merge_warps; with heads across warps each warp writes its own rows, tc_warp_out),
// and of the split pieces inside the kernel (tc_merge_last: the last CTA of each (request,
// kv head x head chunk) to arrive merges the pieces, as merge_kernel would). Device code
// only; per launch one fence, one barrier pair and one atomic per CTA, and hg x D x
// num_splits partial reads by the last CTA.
#pragma once

#include "tc_decode_common.cuh"

#include <cmath>

namespace kvmm::kernels::device {

// The in-kernel split merge (a.merge_counters set): after every thread stored its part of
// the piece's partial (O row, log2-LSE), each thread fences its stores, the CTA meets at a
// barrier and thread 0 counts the CTA's arrival at its (row, kv head x head chunk)
// counter; the CTA that arrives last (num_splits - 1 arrivals before it) fences (acquire),
// resets the counter to 0 for the next launch (no other CTA of this launch touches it
// again: graph replays need no memset) and merges the pieces of its hg q heads exactly as
// merge_kernel does (same order, same arithmetic: the same bits whichever CTA is last),
// reading the partials at L2 (ldcg). `smem` is free (the warps' merge is done).
// The merge's outer loop stays rolled (it runs once per launch and CTA): unrolled, it
// outgrows the main loop, which the SASS census finds as the widest backward branch. The
// loops over the splits are unrolled 4 times: rolled, each of their L2 loads waited for the
// previous one (num_splits x 2 dependent L2 round trips per output element; at batch 1,
// 33 splits, the H200 run of 2026-11-28 measured 126 us against 69.5 with merge_kernel).
// Unrolling keeps the order of the arithmetic, so the bits stay merge_kernel's.
#if defined(KVMM_SIMT_HOST)
#define KVMM_TC_ROLLED
#define KVMM_TC_UNROLL4
#else
#define KVMM_TC_ROLLED _Pragma("unroll 1")
#define KVMM_TC_UNROLL4 _Pragma("unroll 4")
#endif
template <typename T, int D>
__device__ __forceinline__ void tc_merge_last(const AttnArgs& a, unsigned char* smem, std::uint32_t b, bool hf,
                                              std::uint32_t qh0, std::uint32_t hg) {
  std::uint32_t* last = reinterpret_cast<std::uint32_t*>(smem);
  __threadfence();  // this thread's partial stores, before the CTA's arrival
  __syncthreads();  // every thread's fence, before thread 0 counts the arrival
  if (threadIdx.x == 0) {
    // (row b, kv head x head chunk) of this CTA in the grid's order (hf: kv heads along x)
    std::uint32_t* counter =
        a.merge_counters + std::uint64_t{b} * (hf ? gridDim.x : gridDim.y) + (hf ? blockIdx.x : blockIdx.y);
    const bool is_last = atomicAdd(counter, 1u) == a.num_splits - 1;
    if (is_last) atomicExch(counter, 0u);
    __threadfence();  // acquire: the other pieces' partials, before this CTA reads them
    *last = is_last ? 1u : 0u;
  }
  __syncthreads();
  if (*last == 0u) return;
  KVMM_TC_ROLLED
  for (std::uint32_t idx = threadIdx.x; idx < hg * D; idx += kTcThreads) {
    const std::uint32_t d = idx % D;
    const std::uint64_t head = std::uint64_t{b} * a.q_heads + qh0 + idx / D;
    const float* lse = a.ws_lse + head * a.num_splits;
    float big = -INFINITY;
    KVMM_TC_UNROLL4
    for (std::uint32_t s = 0; s < a.num_splits; ++s) big = fmaxf(big, ldcg(lse + s));
    float weight = 0.0f, out = 0.0f;
    if (big != -INFINITY) {
      KVMM_TC_UNROLL4
      for (std::uint32_t s = 0; s < a.num_splits; ++s) {
        const float w = softmax_weight(SoftmaxState<float>{ldcg(lse + s), 1.0f}, big, Exp2{});
        weight += w;
        out = fmaf(w, ldcg(a.ws_o + (head * a.num_splits + s) * D + d), out);
      }
    }
    a.o[head * D + d] = T::from_float(weight > 0.0f ? out / weight : 0.0f);
  }
}

// The CTA's merge of its warps' states (the body's end, after the barrier that ends the
// ring's use): per warp and row m, l and the O row into `smem`, then each thread combines
// the warps' parts of its output elements as merge_kernel would and writes the output (one
// piece) or its piece's partial (split pieces). o holds the C fragments of the 16-row form
// (kOt = D / 8) or, kSwap, O^T's (kOt = D / 16). Costs 16 x D x kTcWarps x 4 bytes of shared
// stores and loads, and hg x D output elements.
template <typename T, int D, bool kSwap, int kOt>
__device__ __forceinline__ void tc_merge_warps(const AttnArgs& a, unsigned char* smem, const float (&o)[kOt][4],
                                               const SoftmaxState<float> (&st)[2], int warp, int gid, int tig,
                                               std::uint32_t b, std::uint32_t qh0, std::uint32_t hg) {
  float* mw = reinterpret_cast<float*>(smem);  // [warps][16]
  float* lw = mw + kTcWarps * kTcRows;         // [warps][16]
  float* ow = lw + kTcWarps * kTcRows;         // [warps][16][D]
  if constexpr (kSwap) {
    if (gid == 0) {
      KVMM_UNROLL
      for (int h2 = 0; h2 < 2; ++h2) {
        mw[warp * kTcRows + 2 * tig + h2] = st[h2].m;
        lw[warp * kTcRows + 2 * tig + h2] = st[h2].l;
      }
    }
    KVMM_UNROLL
    for (int mt = 0; mt < kOt; ++mt) {
      KVMM_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int row = 2 * tig + (i & 1), col = 16 * mt + gid + ((i & 2) ? 8 : 0);
        ow[(warp * kTcRows + row) * D + col] = o[mt][i];
      }
    }
  } else {
    if (tig == 0) {
      mw[warp * kTcRows + gid] = st[0].m;
      mw[warp * kTcRows + gid + 8] = st[1].m;
      lw[warp * kTcRows + gid] = st[0].l;
      lw[warp * kTcRows + gid + 8] = st[1].l;
    }
    KVMM_UNROLL
    for (int n = 0; n < kOt; ++n) {
      KVMM_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int row = gid + ((i & 2) ? 8 : 0), col = 8 * n + 2 * tig + (i & 1);
        ow[(warp * kTcRows + row) * D + col] = o[n][i];
      }
    }
  }
  __syncthreads();
  const int ng = static_cast<int>(hg);
  for (int idx = static_cast<int>(threadIdx.x); idx < ng * D; idx += kTcThreads) {
    const int row = idx / D, d = idx % D;
    float big_m = -INFINITY;
    KVMM_UNROLL
    for (int w = 0; w < kTcWarps; ++w) big_m = fmaxf(big_m, mw[w * kTcRows + row]);
    float big_l = 0.0f, out = 0.0f;
    if (big_m != -INFINITY) {
      KVMM_UNROLL
      for (int w = 0; w < kTcWarps; ++w) {
        const SoftmaxState<float> sw{mw[w * kTcRows + row], lw[w * kTcRows + row]};
        const float wt = softmax_weight(sw, big_m, Exp2{});
        big_l = fmaf(sw.l, wt, big_l);
        out = fmaf(ow[(w * kTcRows + row) * D + d], wt, out);
      }
    }
    const float value = big_l > 0.0f ? out / big_l : 0.0f;
    const std::uint64_t head = std::uint64_t{b} * a.q_heads + qh0 + static_cast<std::uint32_t>(row);
    if (a.num_splits == 1) {
      a.o[head * D + d] = T::from_float(value);
    } else {
      stg(a.ws_o + (head * a.num_splits + blockIdx.z) * D + d, value);
      if (d == 0) stg(a.ws_lse + head * a.num_splits + blockIdx.z, big_l > 0.0f ? big_m + log2f(big_l) : -INFINITY);
    }
  }
}

// The end of a CTA whose warps each walked every tile of one kv head's piece (heads across
// warps: tc_decode_hw.cuh, tc_decode_body's kHw), so that a warp's softmax state is its
// head's piece's and no merge of warps is needed: each lane writes its O^T elements (dims 16
// mt + gid + 8 (i / 2) of q heads 2 tig + i % 2) divided by l (one piece), or the piece's
// partial (O row and log2-LSE m + log2 l, the layout merge_kernel and tc_merge_last read);
// a warp past the last kv head writes nothing. Then, with the in-kernel split merge, the
// last CTA of each (request, 4-kv-head chunk) merges its chunk's q heads (contiguous: kv
// head h holds q heads h group ..). The same values tc_merge_warps writes for a CTA whose
// other warps saw no key. Everything but o and st is recomputed here from the special
// registers and the kernel's parameters, so none of it is held across the main loop.
// Costs D / 4 stores per lane.
template <typename T, int D>
__device__ __forceinline__ void tc_warp_out(const AttnArgs& a, unsigned char* smem, const float (&o)[D / 16][4],
                                            const SoftmaxState<float> (&st)[2]) {
  const std::uint32_t warp = threadIdx.x / 32, gid = (threadIdx.x % 32) / 4, tig = threadIdx.x % 4;
  const std::uint32_t b = a.heads_first ? blockIdx.y : blockIdx.x;
  const std::uint32_t c0 = (a.heads_first ? blockIdx.x : blockIdx.y) * kTcWarps, kvh = a.q_heads / a.group;
  const std::uint32_t hg = c0 + warp < kvh ? a.group : 0u, qh0 = (c0 + warp) * a.group;
  KVMM_UNROLL
  for (std::uint32_t i2 = 0; i2 < 2; ++i2) {
    const std::uint32_t row = 2 * tig + i2;
    if (row >= hg) continue;
    const std::uint64_t head = std::uint64_t{b} * a.q_heads + qh0 + row;
    const float l = st[i2].l;
    KVMM_UNROLL
    for (int mt = 0; mt < D / 16; ++mt) {
      KVMM_UNROLL
      for (int i = static_cast<int>(i2); i < 4; i += 2) {
        const std::uint32_t d = static_cast<std::uint32_t>(16 * mt + ((i & 2) ? 8 : 0)) + gid;
        const float value = l > 0.0f ? o[mt][i] / l : 0.0f;
        if (a.num_splits == 1)
          a.o[head * D + d] = T::from_float(value);
        else
          stg(a.ws_o + (head * a.num_splits + blockIdx.z) * D + d, value);
      }
    }
    if (a.num_splits > 1 && gid == 0)
      stg(a.ws_lse + head * a.num_splits + blockIdx.z, l > 0.0f ? st[i2].m + log2f(l) : -INFINITY);
  }
  if (a.num_splits > 1 && a.merge_counters != nullptr)
    tc_merge_last<T, D>(a, smem, b, a.heads_first, c0 * a.group, (min(kvh, c0 + kTcWarps) - c0) * a.group);
}

}  // namespace kvmm::kernels::device
