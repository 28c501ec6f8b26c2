// The sm_90a prefill scaffold (kernels/hopper_prefill.cuh, issue 37 item 2) as an
// experimental entry point: paged causal prefill on wgmma + TMA + mbarrier, bf16, head dim
// 128, pages of 8/16/32 or a multiple of 64 tokens, one split, V after K in the page
// (the page-layer layout). Runs only on compute capability 9.0 from a build whose
// KVMM_CUDA_ARCHITECTURES holds 90 (the kernel is compiled for sm_90a alone); anything
// else raises kvmm::Error naming the argument or the device. One launch, O(KV bytes).
#pragma once

#include "kvmm/kernels/attention.hpp"

#include <cstdint>

namespace kvmm::kernels::experimental {

// num_pages: pages in the cache's arena (the tensor map's page dimension; ids at or past
// it read zeros); 0 leaves it at 2^31 - 1. round_p_once: P rounded once to bf16 before
// P V (FA2/FA3's numerics: a third fewer tensor-core instructions, a looser error bound);
// by default P is applied as its bf16 part and the bf16 remainder (tc_prefill's numerics).
void paged_prefill_attention_hopper(const PagedAttentionParams& p, Stream stream, std::uint64_t num_pages = 0,
                                    bool round_p_once = false);

// Whether this build holds the sm_90a kernel (KVMM_CUDA_ARCHITECTURES with 90).
bool hopper_prefill_built();

}  // namespace kvmm::kernels::experimental
