// The tensor-core decode attention (kernels/tc_decode.cuh, issue 36) beside the default
// kernel, selectable at run time: same parameters and results as paged_decode_attention /
// contiguous_decode_attention (head dims 64, 128 and 256), so one
// benchmark run times both. Internal to kvmm::cuda until it replaces the default; costs
// one launch (two with split-KV unless the last CTA merges: merge_counters).
#pragma once

#include "kvmm/kernels/attention.hpp"

namespace kvmm::kernels::experimental {

// stages: the cp.async ring's depth per warp, 2 (every head dim), 3 or 4 (head dim 128);
// anything else raises kvmm::Error naming it. Groups of at most 8 q heads at head dims 64
// and 128 run the swapped-operand form (32-token warp tiles at 2 stages), others the
// 16-row form (tc_decode.cuh).
// merge_counters (device memory, tc_merge_counters(rows, q_heads) words, all zero before
// the first launch that uses them, e.g. cudaMemset once after allocation): with split-KV,
// the last CTA of each (request, kv head) merges the pieces inside the kernel (one
// launch) and leaves its counter zero again, so launches, graph replays included, need no
// memset in between; nullptr: a separate merge_kernel launch merges them (the same bits).
void paged_decode_attention_tc(const PagedAttentionParams& p, Stream stream, std::uint32_t stages = 2,
                               std::uint32_t* merge_counters = nullptr);
void contiguous_decode_attention_tc(const ContiguousAttentionParams& p, Stream stream, std::uint32_t stages = 2,
                                    std::uint32_t* merge_counters = nullptr);

// Arrival counters the in-kernel split merge needs for a batch of `rows` decode rows of
// `q_heads` q heads (one per row, kv head and 16-head chunk; at most rows x q_heads).
inline std::size_t tc_merge_counters(std::uint32_t rows, std::uint32_t q_heads) { return std::size_t{rows} * q_heads; }

// Raises kvmm::Error naming `kernel`, stages and head_dim unless the ring can hold
// `stages` at `head_dim` (src/kernels/tc_decode_check.cpp).
void check_tc_stages(const char* kernel, std::uint32_t stages, std::uint32_t head_dim);

}  // namespace kvmm::kernels::experimental
