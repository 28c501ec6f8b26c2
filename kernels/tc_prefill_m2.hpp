// Launch of the 32-rows-per-warp tensor-core prefill instances (tc_prefill_m2.cu, a
// translation unit compiled with ptxas -O1), for tc_prefill.cu: paged caches, D 128;
// `half` picks fp16 over bf16, `round_p_once` the bf16 one-rounded-P instance. Internal to
// kvmm::cuda.
#pragma once

#include "tc_decode_common.cuh"

namespace kvmm::kernels::experimental::detail_tc {

void launch_m2(const device::AttnArgs& a, const device::TcPagedAddr& kv, dim3 grid, bool half, bool round_p_once,
               cudaStream_t s);

}  // namespace kvmm::kernels::experimental::detail_tc
