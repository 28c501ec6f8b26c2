// The tensor-core prefill attention (kernels/tc_prefill.cuh, issue 37) beside the default
// prefill kernel, selectable at run time: same parameters and results as
// paged_prefill_attention / contiguous_prefill_attention (head dims 64 and 128; 256
// raises kvmm::Error), so one benchmark run times both. Internal to kvmm::cuda until it
// replaces the default; costs one launch (two with split-KV).
#pragma once

#include "kvmm/kernels/attention.hpp"

namespace kvmm::kernels::experimental {

// round_p_once: P rounded once to the storage type before P.V (FA2's numerics: 1.5x fewer
// tensor-core instructions, outputs about 10-25 units of roundoff off the references
// instead of 2); false (the default) applies P in two parts.
void paged_prefill_attention_tc(const PagedAttentionParams& p, Stream stream, bool round_p_once = false);
void contiguous_prefill_attention_tc(const ContiguousAttentionParams& p, Stream stream, bool round_p_once = false);

}  // namespace kvmm::kernels::experimental
