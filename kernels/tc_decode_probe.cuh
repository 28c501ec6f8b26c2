// The limiter probes of the tensor-core decode (issue 36, experimental::TcDecodeShape::probe,
// scripts/gpu_kernels.sh limiter): tc_decode_body (tc_decode.cuh) under kTcProbe* as kernels
// of their own, so the shipped instances' names, which the SASS census matches, stay as they
// were. Device code only; each probe costs one more kernel instance (bf16, D 128) in
// kvmm_cuda and, at run time, nothing unless TcDecodeShape::probe asks for it.
#pragma once

#include "tc_decode.cuh"

namespace kvmm::kernels::device {

// Probes of the limiter (issue 36, experimental::TcDecodeShape::probe; only the swapped
// form with sub-tiles in pages, kSub 2, takes them: the launchers run them at bf16, D 128,
// 2 stages). kTcProbeLoadOnly: the same grid, ring, page lookups and cp.async, no math (one
// shared word per tile folded into O, so every stage is read): the memory pipeline's
// ceiling. kTcProbeMathOnly: the same loop without the K/V cp.async (the ring zeroed once:
// logits 0, the rescale untaken as on real data after the first tiles): the math chain's
// ceiling. kTcProbePlainMap: the copy lane map shipped before the sector map (the plain
// layout copied by the stage map: lanes l and l + 16 the two 16-byte halves of row l, so
// each half-warp of a request touches 16 sectors, 24 per request on average as
// simt::GlobalStats::half_warp_sectors counts them, against the default's 16); the same
// shared contents, so the same bits. kTcProbePlainMap is also the one switch that keeps
// the old map for any instance (tc_decode_body; the traffic test compares every instance).
//
// The limiter probes (kTcProbe*) of the default shape at bf16, D 128: paged, 16-token
// multiples, swapped operands, 32-token warp tiles, 2 stages.
template <int kProbe>
__global__ void __launch_bounds__(kTcThreads, 4) tc_decode_probe_kernel(AttnArgs a, TcPagedAddr kv) {
  tc_decode_body<BFloat, 128, TcPagedAddr, true, 2, true, 2, kProbe>(a, kv);
}

}  // namespace kvmm::kernels::device
