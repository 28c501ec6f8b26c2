// The sm_90 part of the kvmm kernel primitives, one API on the device (inline PTX; the
// TMA and mbarrier need sm_90, wgmma needs the sm_90a target, anything older traps) and
// on the host emulation (simt_hopper.hpp, exact; see there):
//   mbar_init / mbar_arrive / mbar_arrive_expect_tx / mbar_try_wait / mbar_wait
//                     mbarrier.* on an 8-byte shared word: init with an arrival count,
//                     arrive (optionally declaring transaction bytes), wait on a phase parity
//   fence_mbarrier_init, fence_proxy_async   the fences around them (no-ops on the host)
//   tma_load<Rank>    cp.async.bulk.tensor.<Rank>d tile load of one box into shared
//                     memory, completing its bytes on an mbarrier (Rank 1..5)
//   TensorMap, TensorMapSpec, check_tensor_map   the tensor map a kernel takes by value
//                     (__grid_constant__); on the device the driver's 128 opaque bytes
//                     (cuTensorMapEncodeTiled, host side), on the host its description;
//                     check_tensor_map raises kvmm::Error for a spec the hardware refuses
//   SmemDesc, make_smem_desc, desc_advance   wgmma's 64-bit shared-memory matrix
//                     descriptor, built from an address or advanced by a byte offset
//   wgmma_fence / wgmma_commit / wgmma_wait<N> / wgmma_m64k16<T, N, TransB>
//                     wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16} with A
//                     K-major in shared memory, B K-major (N = 8, 16 or 64) or MN-major
//                     (TransB, N = 64; scale-d = accumulate)
//   wgmma_m64n64k16_rs<T, TransB>   the same with A from registers (mma.sync's A fragment)
//   setmaxnreg_dec<N> / setmaxnreg_inc<N>   setmaxnreg.{dec,inc}.sync.aligned.u32 N: a
//                     warpgroup gives registers back to the CTA's pool or takes them
//                     (producer/consumer register reallocation; no-ops on the host)
// Each wrapper is one instruction on the device (mbar_wait: a try_wait loop).
#pragma once

#include "common.cuh"

#if defined(KVMM_SIMT_HOST)
#include "simt_hopper.hpp"
#endif

#if !defined(__CUDACC__)
#include "kvmm/error.hpp"
#endif

#include <cstdint>
#include <type_traits>

namespace kvmm::kernels::device {

#if defined(KVMM_SIMT_HOST) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
#define KVMM_SM90_PRESENT 1
#endif
#if defined(KVMM_SIMT_HOST) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVMM_SM90A_PRESENT 1
#endif

// mbarrier ---------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
#if defined(KVMM_SIMT_HOST)
  return static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(p));
#else
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
#endif
}

__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
#if defined(KVMM_SIMT_HOST)
  simt::Hopper::get().init(bar, count);
#elif defined(KVMM_SM90_PRESENT)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}

// Makes the initialised barrier visible to the async proxy (the TMA unit).
__device__ __forceinline__ void fence_mbarrier_init() {
#if !defined(KVMM_SIMT_HOST) && defined(KVMM_SM90_PRESENT)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Orders this thread's ordinary shared-memory writes before later async-proxy reads.
__device__ __forceinline__ void fence_proxy_async() {
#if !defined(KVMM_SIMT_HOST) && defined(KVMM_SM90_PRESENT)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
#if defined(KVMM_SIMT_HOST)
  simt::Hopper::get().arrive(bar, 0);
#elif defined(KVMM_SM90_PRESENT)
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
#else
  __trap();
#endif
}

// Arrives and adds `bytes` to the phase's expected transaction count (the TMA loads that
// will complete on this barrier).
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
#if defined(KVMM_SIMT_HOST)
  simt::Hopper::get().arrive(bar, bytes);
#elif defined(KVMM_SM90_PRESENT)
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// True once the phase of parity `parity` (0 for the first phase) has completed.
__device__ __forceinline__ bool mbar_try_wait(std::uint64_t* bar, std::uint32_t parity) {
#if defined(KVMM_SIMT_HOST)
  return simt::Hopper::get().done(bar, parity);
#elif defined(KVMM_SM90_PRESENT)
  std::uint32_t ok;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(ok)
               : "r"(smem_u32(bar)), "r"(parity)
               : "memory");
  return ok != 0;
#else
  __trap();
  return false;
#endif
}

__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
#if defined(KVMM_SIMT_HOST)
  simt::Hopper::get().wait(bar, parity);
#else
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}

// TMA ----------------------------------------------------------------------------------

// What a tensor map describes (host side): a tensor of `rank` dimensions, innermost
// first, and the box one tma_load copies. Limits (CUDA driver API, cuTensorMapEncodeTiled):
// base 16-byte aligned, rank 1..5, every dimension 1..2^32, byte strides of dimensions
// 1.. multiples of 16 and below 2^40, box extents 1..256, the innermost box a multiple of
// 16 bytes, and at most 128 bytes under the 128-byte swizzle.
struct TensorMapSpec {
  const void* base = nullptr;
  unsigned rank = 0;
  std::uint64_t dims[5] = {};
  std::uint64_t strides[5] = {};  // strides[d] for d >= 1, bytes
  unsigned box[5] = {};
  unsigned elem_bytes = 2;
  bool swizzle128 = false;
};

#if !defined(__CUDACC__)  // host C++ only (fmt's compile-time format check does not pass nvcc)
inline void check_tensor_map(const TensorMapSpec& s) {
  if (s.base == nullptr || reinterpret_cast<std::uintptr_t>(s.base) % 16 != 0)
    fail("tensor map base = {}: must be 16-byte aligned and not null", s.base);
  if (s.rank < 1 || s.rank > 5) fail("tensor map rank = {}: must be 1..5", s.rank);
  if (s.elem_bytes != 1 && s.elem_bytes != 2 && s.elem_bytes != 4)
    fail("tensor map elem_bytes = {}: must be 1, 2 or 4", s.elem_bytes);
  for (unsigned d = 0; d < s.rank; ++d) {
    if (s.dims[d] == 0 || s.dims[d] > (std::uint64_t{1} << 32))
      fail("tensor map dims[{}] = {}: must be 1..2^32", d, s.dims[d]);
    if (s.box[d] == 0 || s.box[d] > 256) fail("tensor map box[{}] = {}: must be 1..256", d, s.box[d]);
    if (d >= 1 && (s.strides[d] % 16 != 0 || s.strides[d] >= (std::uint64_t{1} << 40)))
      fail("tensor map strides[{}] = {}: must be a multiple of 16 below 2^40", d, s.strides[d]);
  }
  const unsigned inner = s.box[0] * s.elem_bytes;
  if (inner % 16 != 0) fail("tensor map box[0] = {}: {} bytes, not a multiple of 16", s.box[0], inner);
  if (s.swizzle128 && inner > 128)
    fail("tensor map box[0] = {}: {} bytes, over the 128-byte swizzle span", s.box[0], inner);
}
#endif

struct alignas(64) TensorMap {
#if defined(KVMM_SIMT_HOST)
  simt::TensorMapDesc desc;
#else
  unsigned char opaque[128];  // CUtensorMap as cuTensorMapEncodeTiled writes it
#endif
};

#if defined(KVMM_SIMT_HOST)
// The emulation's tensor map (checked as the driver would).
inline TensorMap host_tensor_map(const TensorMapSpec& s) {
  check_tensor_map(s);
  TensorMap m{};
  m.desc.base = s.base;
  m.desc.rank = s.rank;
  for (unsigned d = 0; d < 5; ++d) {
    m.desc.dims[d] = s.dims[d];
    m.desc.strides[d] = s.strides[d];
    m.desc.box[d] = s.box[d];
  }
  m.desc.elem_bytes = s.elem_bytes;
  m.desc.swizzle128 = s.swizzle128;
  return m;
}
#endif

// One box at `coord` (innermost first; may reach outside the tensor: zero fill) into
// `smem` (128-byte aligned; 1024 under the swizzle), its bytes completed on `bar`.
template <int Rank>
__device__ __forceinline__ void tma_load(void* smem, const TensorMap& map, const int (&coord)[Rank],
                                         std::uint64_t* bar KVMM_SITE_PARAM) {
  static_assert(Rank >= 1 && Rank <= 5);
#if defined(KVMM_SIMT_HOST)
  if (map.desc.rank != Rank) throw std::logic_error("simt: tma_load rank differs from the tensor map's");
  simt::Hopper::get().tma_load(smem, map.desc, coord, bar, KVMM_SITE_LINE);
#elif defined(KVMM_SM90_PRESENT)
  const auto dst = smem_u32(smem), mb = smem_u32(bar);
  const auto tm = reinterpret_cast<std::uint64_t>(&map);
  if constexpr (Rank == 1) {
    asm volatile(
        "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n" ::
            "r"(dst),
        "l"(tm), "r"(coord[0]), "r"(mb)
        : "memory");
  } else if constexpr (Rank == 2) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(tm), "r"(coord[0]), "r"(coord[1]), "r"(mb)
        : "memory");
  } else if constexpr (Rank == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"(tm), "r"(coord[0]), "r"(coord[1]), "r"(coord[2]), "r"(mb)
        : "memory");
  } else if constexpr (Rank == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];\n" ::"r"(dst),
        "l"(tm), "r"(coord[0]), "r"(coord[1]), "r"(coord[2]), "r"(coord[3]), "r"(mb)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5, %6}], [%7];\n" ::"r"(dst),
        "l"(tm), "r"(coord[0]), "r"(coord[1]), "r"(coord[2]), "r"(coord[3]), "r"(coord[4]), "r"(mb)
        : "memory");
  }
#else
  __trap();
#endif
}

// wgmma --------------------------------------------------------------------------------

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format" of wgmma): start
// address >> 4 in bits 0-13, leading-dimension byte offset >> 4 in 16-29, stride-
// dimension byte offset >> 4 in 32-45, swizzle mode in 62-63 (0: none, 1: 128 bytes).
// K-major operands: no swizzle: 8 rows x 16 bytes core matrices, LBO between the two
// core matrices of a k16 step, SBO between 8-row groups; 128-byte swizzle: 128-byte rows
// in 1024-byte atoms, SBO between atoms (1024 when packed), LBO unused.
struct SmemDesc {
  std::uint64_t bits;
#if defined(KVMM_SIMT_HOST)
  const void* ptr;
#endif
};

__host__ __device__ __forceinline__ std::uint64_t smem_desc_bits(std::uint32_t smem_addr, std::uint32_t lbo,
                                                                 std::uint32_t sbo, bool swizzle128) {
  return std::uint64_t{(smem_addr & 0x3ffffu) >> 4} | (std::uint64_t{(lbo >> 4) & 0x3fffu} << 16) |
         (std::uint64_t{(sbo >> 4) & 0x3fffu} << 32) | (swizzle128 ? std::uint64_t{1} << 62 : 0);
}

__device__ __forceinline__ SmemDesc make_smem_desc(const void* smem, std::uint32_t lbo, std::uint32_t sbo,
                                                   bool swizzle128) {
#if defined(KVMM_SIMT_HOST)
  return SmemDesc{smem_desc_bits(smem_u32(smem), lbo, sbo, swizzle128), smem};
#else
  return SmemDesc{smem_desc_bits(smem_u32(smem), lbo, sbo, swizzle128)};
#endif
}

// The descriptor of the same operand layout `bytes` further on (a multiple of 16; the start
// stays in the 18-bit shared window, so the start field does not carry into bit 14): one
// 32-bit add on the low word, instead of rebuilding the descriptor from an address (a
// mask, a shift and an OR per wgmma).
__device__ __forceinline__ SmemDesc desc_advance(SmemDesc d, std::uint32_t bytes) {
  const std::uint64_t bits = (d.bits & 0xffffffff00000000ull) | (static_cast<std::uint32_t>(d.bits) + (bytes >> 4));
#if defined(KVMM_SIMT_HOST)
  return SmemDesc{bits, static_cast<const unsigned char*>(d.ptr) + bytes};
#else
  return SmemDesc{bits};
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if !defined(KVMM_SIMT_HOST) && defined(KVMM_SM90A_PRESENT)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif !defined(KVMM_SIMT_HOST)
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(KVMM_SIMT_HOST)
  simt::Hopper::get().wgmma_commit();
#elif defined(KVMM_SM90A_PRESENT)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(Pending >= 0 && Pending < 8);
#if defined(KVMM_SIMT_HOST)
  simt::Hopper::get().wgmma_wait(Pending);
#elif defined(KVMM_SM90A_PRESENT)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#else
  __trap();
#endif
}

#if defined(KVMM_SIMT_HOST)
inline simt::DescView desc_view(const SmemDesc& s) {
  return simt::DescView{static_cast<const unsigned char*>(s.ptr), ((s.bits >> 16) & 0x3fffu) << 4,
                        ((s.bits >> 32) & 0x3fffu) << 4, ((s.bits >> 62) & 3u) == 1};
}
#endif

// The n64 forms' 32 accumulator operands (the asm statements below).
#define KVMM_WG_D32                                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define KVMM_WG_OUT32                                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D (64 x N, fp32, N / 2 per thread) = A (64 x 16) * B (16 x N) (+ D when accumulate),
// issued by the 4 warps of a warpgroup together; D is valid after wgmma_commit and
// wgmma_wait. A K-major; B K-major (stored N rows of K), or with TransB (N = 64 only)
// MN-major: K rows of N contiguous elements, under the 128-byte swizzle 8-row atoms of
// 64 elements, 8-row groups SBO apart along K (64-element panels LBO apart along N:
// none within N = 64).
template <typename T, int N, bool TransB = false>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], SmemDesc a, SmemDesc b,
                                             bool accumulate KVMM_SITE_PARAM) {
  static_assert(std::is_same_v<T, BFloat> || std::is_same_v<T, Half>);
  static_assert(N == 8 || N == 16 || N == 64, "wgmma_m64k16: N = 8, 16 or 64");
  static_assert(!TransB || N == 64, "wgmma_m64k16: an MN-major B with N = 64 only");
#if defined(KVMM_SIMT_HOST)
  simt::wgmma_warp(std::is_same_v<T, BFloat>, N, d, desc_view(a), nullptr, desc_view(b), TransB, accumulate,
                   KVMM_SITE_LINE);
#elif defined(KVMM_SM90A_PRESENT)
  const std::uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (N == 64) {
    if constexpr (std::is_same_v<T, BFloat>) {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KVMM_WG_D32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
          : KVMM_WG_OUT32
          : "l"(a.bits), "l"(b.bits), "r"(scale_d), "n"(TransB ? 1 : 0)
          : "memory");
    } else {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVMM_WG_D32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
          : KVMM_WG_OUT32
          : "l"(a.bits), "l"(b.bits), "r"(scale_d), "n"(TransB ? 1 : 0)
          : "memory");
    }
  } else if constexpr (N == 8) {
    if constexpr (std::is_same_v<T, BFloat>) {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "l"(a.bits), "l"(b.bits), "r"(scale_d)
          : "memory");
    } else {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "l"(a.bits), "l"(b.bits), "r"(scale_d)
          : "memory");
    }
  } else {
    if constexpr (std::is_same_v<T, BFloat>) {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, "
          "0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
          : "l"(a.bits), "l"(b.bits), "r"(scale_d)
          : "memory");
    } else {
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
          " wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, "
          "0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
          : "l"(a.bits), "l"(b.bits), "r"(scale_d)
          : "memory");
    }
  }
#else
  __trap();
#endif
}

// D (64 x 64) = A (64 x 16) * B (16 x 64) (+ D), A from registers: this thread's four
// .b32 of two elements each, the layout of mma.m16n8k16's A fragment on the rows 16 *
// (warp % 4) .. + 15 of the warp (PTX ISA: wgmma .m64nNk16 register fragment of A); B in
// shared memory as wgmma_m64k16's (K-major, or MN-major with TransB).
template <typename T, bool TransB = false>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const std::uint32_t (&a)[4], SmemDesc b,
                                                   bool accumulate KVMM_SITE_PARAM) {
  static_assert(std::is_same_v<T, BFloat> || std::is_same_v<T, Half>);
#if defined(KVMM_SIMT_HOST)
  simt::wgmma_warp(std::is_same_v<T, BFloat>, 64, d, simt::DescView{}, a, desc_view(b), TransB, accumulate,
                   KVMM_SITE_LINE);
#elif defined(KVMM_SM90A_PRESENT)
  const std::uint32_t scale_d = accumulate ? 1u : 0u;
  if constexpr (std::is_same_v<T, BFloat>) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KVMM_WG_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : KVMM_WG_OUT32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b.bits), "r"(scale_d), "n"(TransB ? 1 : 0)
        : "memory");
  } else {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVMM_WG_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : KVMM_WG_OUT32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b.bits), "r"(scale_d), "n"(TransB ? 1 : 0)
        : "memory");
  }
#else
  __trap();
#endif
}

// Register reallocation (sm_90a): every thread of the warpgroup executes it; N a multiple
// of 8 in 24..256. inc blocks until the CTA's pool holds the registers, so the kernel's
// entry count times its threads must cover the warpgroups' counts after reallocation.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256);
#if !defined(KVMM_SIMT_HOST) && defined(KVMM_SM90A_PRESENT)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#elif !defined(KVMM_SIMT_HOST)
  __trap();
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256);
#if !defined(KVMM_SIMT_HOST) && defined(KVMM_SM90A_PRESENT)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#elif !defined(KVMM_SIMT_HOST)
  __trap();
#endif
}

}  // namespace kvmm::kernels::device
