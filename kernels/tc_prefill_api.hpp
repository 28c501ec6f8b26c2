// The tensor-core prefill attention (kernels/tc_prefill.cuh, issue 37) beside the default
// prefill kernel, selectable at run time: same parameters and results as
// paged_prefill_attention / contiguous_prefill_attention (head dims 64 and 128; 256
// raises kvmm::Error), so one benchmark run times both. Internal to kvmm::cuda until it
// replaces the default; costs one launch (two with split-KV).
#pragma once

#include "kvmm/kernels/attention.hpp"

#include <cstdint>

namespace kvmm::kernels::experimental {

// Rows of the Q tile per warp: 16 (64-row Q tiles, Q in registers: the first form) or 32
// (128-row Q tiles in shared memory, each K/V fragment feeding two m-tiles: FA2's
// hdim-128 shape; paged caches at head_dim 128 only, other requests raise kvmm::Error).
enum class TcPrefillRows : std::uint8_t { k16 = 16, k32 = 32 };

// round_p_once: P rounded once to the storage type before P.V (FA2's numerics: 1.5x fewer
// tensor-core instructions, outputs about 10-25 units of roundoff off the references
// instead of 2); false (the default) applies P in two parts.
void paged_prefill_attention_tc(const PagedAttentionParams& p, Stream stream, bool round_p_once = false,
                                TcPrefillRows rows = TcPrefillRows::k16);
void contiguous_prefill_attention_tc(const ContiguousAttentionParams& p, Stream stream, bool round_p_once = false,
                                     TcPrefillRows rows = TcPrefillRows::k16);

}  // namespace kvmm::kernels::experimental
