// Random bf16 fill of device memory for the kernel benchmarks (fill.cu).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvmm::bench {

// Fills `bytes` (a multiple of 4) at device pointer `p` with bf16 values uniform in
// [-1, 1), a pure function of (seed, index). Asynchronous on the default stream.
void fill_random_bf16(void* p, std::size_t bytes, std::uint64_t seed);

}  // namespace kvmm::bench
