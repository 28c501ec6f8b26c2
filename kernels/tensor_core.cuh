// Tensor-core primitives of the kvmm kernels, one API on the device (inline PTX, sm_80+)
// and on the host emulation (simt_warp.hpp, exact; see there):
//   mma_16816<T>      D = A * B + C, mma.sync.aligned.m16n8k16.row.col, T = BFloat or Half
//                     inputs, fp32 accumulators; fragments as the PTX ISA lays them out
//                     (A: 4 x .b32 per lane, B: 2, C/D: 4 floats), 4,096 FLOP per warp
//   ldmatrix<N, Trans>  ldmatrix.sync.aligned.m8n8.xN(.trans).shared.b16, N = 1, 2, 4:
//                     lanes 8m..8m+7 give the 8 row addresses (16 bytes each) of matrix m
//   pack2<T>          two floats rounded to T, packed low-first into one .b32 (the A
//                     fragment of a P.V product from C fragments)
//   movmatrix_trans   movmatrix.sync.aligned.m8n8.trans.b16: an 8x8 16-bit fragment
//                     transposed in registers (a C tile of P^T as a B operand)
// All three are warp-wide: every lane of the warp executes them together.
#pragma once

#include "common.cuh"
#include "memory.cuh"

#include <type_traits>

namespace kvmm::kernels::device {

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                                          const float (&c)[4]) {
  static_assert(std::is_same_v<T, BFloat> || std::is_same_v<T, Half>);
#if defined(KVMM_SIMT_HOST)
  simt::mma_16816(std::is_same_v<T, BFloat>, d, a, b, c);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  if constexpr (std::is_same_v<T, BFloat>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
#endif
}

template <int N, bool Trans = false>
__device__ __forceinline__ void ldmatrix(std::uint32_t (&r)[N], const void* smem_row KVMM_SITE_PARAM) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(KVMM_SIMT_HOST)
  simt::ldmatrix<N, Trans>(r, smem_row, KVMM_SITE_LINE);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_row));
  if constexpr (N == 1) {
    if constexpr (Trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
  } else if constexpr (N == 2) {
    if constexpr (Trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                   : "=r"(r[0]), "=r"(r[1])
                   : "r"(addr));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
  } else {
    if constexpr (Trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(addr));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(addr));
  }
#endif
}

// movmatrix.sync.aligned.m8n8.trans.b16 (sm_75+): lane l holds row l / 4, columns 2 (l % 4)
// and 2 (l % 4) + 1 of an 8x8 matrix of 16-bit elements (low half first); returns the same
// fragment of its transpose. Warp-wide.
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
#if defined(KVMM_SIMT_HOST)
  return simt::movmatrix_trans(x);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
  return x;
#else
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
#endif
}

template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  return std::uint32_t{T::from_float(lo)} | (std::uint32_t{T::from_float(hi)} << 16);
}

}  // namespace kvmm::kernels::device
