// Device helpers shared by the kvmm kernels: 16-byte vector loads of 8 fp16/bf16
// elements and their conversion to float, stores of one element. Reusable device code here never reads threadIdx
// itself.
#pragma once

#include "kvmm/kernels/addressing.hpp"
#include "kvmm/kernels/attention.hpp"
#include "kvmm/kernels/online_softmax.hpp"

#include "memory.cuh"  // the CUDA headers, or the host emulation (KVMM_SIMT_HOST)

#if defined(KVMM_SIMT_HOST)
#define KVMM_UNROLL
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define KVMM_UNROLL _Pragma("unroll")
#endif

#include <cstdint>

namespace kvmm::kernels::device {

inline constexpr std::uint32_t kNull = 0xffffffffu;  // kvmm::kNullPage

// Storage traits: Half (fp16) and BFloat (bf16), both 2 bytes.
struct Half {
  static __device__ __forceinline__ float lo(std::uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  }
  static __device__ __forceinline__ float hi(std::uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  static __device__ __forceinline__ std::uint16_t from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

struct BFloat {
  static __device__ __forceinline__ float lo(std::uint32_t w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(std::uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ std::uint16_t from_float(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};

// Eight elements of a 16-byte vector as floats.
template <typename T>
__device__ __forceinline__ void to_float8(const uint4& u, float (&f)[8]) {
  f[0] = T::lo(u.x);
  f[1] = T::hi(u.x);
  f[2] = T::lo(u.y);
  f[3] = T::hi(u.y);
  f[4] = T::lo(u.z);
  f[5] = T::hi(u.z);
  f[6] = T::lo(u.w);
  f[7] = T::hi(u.w);
}

}  // namespace kvmm::kernels::device
