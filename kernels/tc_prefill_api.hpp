// The tensor-core prefill attention (kernels/tc_prefill.cuh, issue 37) beside the default
// prefill kernel, selectable at run time: same parameters and results as
// paged_prefill_attention / contiguous_prefill_attention (head dims 64 and 128; 256
// raises kvmm::Error), so one benchmark run times both. Internal to kvmm::cuda until it
// replaces the default; costs one launch (two with split-KV).
#pragma once

#include "kvmm/kernels/attention.hpp"

namespace kvmm::kernels::experimental {

void paged_prefill_attention_tc(const PagedAttentionParams& p, Stream stream);
void contiguous_prefill_attention_tc(const ContiguousAttentionParams& p, Stream stream);

}  // namespace kvmm::kernels::experimental
