// The tensor-core decode attention (kernels/tc_decode.cuh, issue 36) beside the default
// kernel, selectable at run time: same parameters and results as paged_decode_attention /
// contiguous_decode_attention (head dims 64, 128 and 256), so one
// benchmark run times both. Internal to kvmm::cuda until it replaces the default; costs
// one launch (two with split-KV).
#pragma once

#include "kvmm/kernels/attention.hpp"

namespace kvmm::kernels::experimental {

void paged_decode_attention_tc(const PagedAttentionParams& p, Stream stream);
void contiguous_decode_attention_tc(const ContiguousAttentionParams& p, Stream stream);

}  // namespace kvmm::kernels::experimental
