// The scenarios of the sm_90a prefill scaffold's tests (emulator: hopper_prefill_test.cpp;
// GPU: gpu/hopper_prefill_gpu_test.cpp): what the kernel builds (bf16, head dim 128,
// causal prefill), GQA `group` (8: one kv head, else two), `tpp`-token pages, ragged
// batches of up to max_q_len new tokens over up to max_kv_len.
#pragma once

#include "kernels/kernel_fixture.hpp"

namespace kvmm::test {

inline ScenarioConfig hp_config(std::uint32_t group, std::uint32_t tpp, std::uint64_t seed, std::uint32_t batch,
                                std::uint32_t max_kv_len, std::uint32_t max_q_len) {
  ScenarioConfig c;
  c.dtype = DType::kBF16;
  c.head_dim = 128;
  c.prefill = true;
  c.options.mask = MaskKind::kCausal;
  c.group = group;
  c.kv_heads = group >= 8 ? 1 : 2;
  c.tokens_per_page = tpp;
  c.batch = batch;
  c.max_kv_len = max_kv_len;
  c.max_q_len = max_q_len;
  c.seed = seed;
  return c;
}

}  // namespace kvmm::test
