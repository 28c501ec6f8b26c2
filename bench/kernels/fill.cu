// Random bf16 data on the device for the kernel benchmarks: constant data can time faster
// than real data (tensor-core prefill most of all), so K/V and Q are filled with values
// uniform in [-1, 1) rounded to bf16, from a hash of (seed, index): reproducible, and
// gigabytes in milliseconds.
#include "fill.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ __forceinline__ std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__device__ __forceinline__ std::uint32_t bf16_bits(std::uint32_t h) {
  // 24 random bits -> [-1, 1) as float, truncated to its top 16 bits (bf16).
  const float f = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
  return __float_as_uint(f) >> 16;
}

__global__ void fill_bf16_kernel(std::uint32_t* words, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t key = seed * 0x9e3779b97f4a7c15ull + 2 * i;
    words[i] = bf16_bits(mix(key)) | (bf16_bits(mix(key + 1)) << 16);
  }
}

}  // namespace

namespace kvmm::bench {

void fill_random_bf16(void* p, std::size_t bytes, std::uint64_t seed) {
  const std::uint64_t n = bytes / 4;
  if (n == 0) return;
  fill_bf16_kernel<<<1024, 256>>>(static_cast<std::uint32_t*>(p), n, seed);
}

}  // namespace kvmm::bench
