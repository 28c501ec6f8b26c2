// The tensor-core decode attention (kernels/tc_decode.cuh, issue 36) beside the default
// kernel, selectable at run time: same parameters and results as paged_decode_attention /
// contiguous_decode_attention (head dims 64, 128 and 256), so one
// benchmark run times both. Internal to kvmm::cuda until it replaces the default; costs
// one launch (two with split-KV).
#pragma once

#include "kvmm/kernels/attention.hpp"

namespace kvmm::kernels::experimental {

// stages: the cp.async ring's depth per warp, 2 (every head dim), 3 or 4 (head dim 128);
// anything else raises kvmm::Error naming it. Groups of at most 8 q heads at head dims 64
// and 128 run the swapped-operand form (32-token warp tiles at 2 stages), others the
// 16-row form (tc_decode.cuh).
void paged_decode_attention_tc(const PagedAttentionParams& p, Stream stream, std::uint32_t stages = 2);
void contiguous_decode_attention_tc(const ContiguousAttentionParams& p, Stream stream, std::uint32_t stages = 2);

// Raises kvmm::Error naming `kernel`, stages and head_dim unless the ring can hold
// `stages` at `head_dim` (src/kernels/tc_decode_check.cpp).
void check_tc_stages(const char* kernel, std::uint32_t stages, std::uint32_t head_dim);

}  // namespace kvmm::kernels::experimental
