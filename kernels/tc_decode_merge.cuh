// The tensor-core decode's split merge inside the kernel (tc_decode.cuh, issue 36): the
// last CTA of each (request, kv head x head chunk) to arrive merges the pieces, as
// merge_kernel would. Device code only; per launch one fence, one barrier pair and one
// atomic per CTA, and hg x D x num_splits partial reads by the last CTA.
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

}  // namespace kvmm::kernels::device
