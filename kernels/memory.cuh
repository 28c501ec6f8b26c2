// Memory-access primitives of the kvmm kernels, one API on the device (intrinsics and
// inline PTX) and on the host emulation (simt_host.hpp, where each access is also
// logged for traffic accounting when a simt::TrafficLog is active):
//   ldg16 / ldg16_if     16-byte read-only global load (LDG.E.128.CONSTANT); _if: zero
//                        and no access when the predicate is false
//   ldg<V>               4- or 8-byte read-only global load (page ids, Q words)
//   lds / sts            shared loads and stores of 4, 8 or 16 bytes
//   cp_async<B>          cp.async of B = 4, 8 or 16 bytes global -> shared, with a source
//                        size below B zero-filling the rest (0: nothing read, a null page)
//   cp_async_commit / cp_async_wait<N>   close the thread's open group / wait until at
//                        most N of its groups are pending (sm_80+; the data of a copy is
//                        visible to other threads only after the wait and a barrier)
//   stg / ldcg           4-byte global store, and load at L2 (ld.global.cg, coherent across
//                        SMs): words one CTA hands to another (split partials), published
//                        by __threadfence() and an atomic, read after an atomic and a fence
//                        (the emulation checks that order: simt_global.hpp)
// Every wrapper costs what its instruction costs on the device; on the host, one log
// record per lane when logging. New kernels access memory only through these.
#pragma once

#if defined(KVMM_SIMT_HOST)
#include "simt_global.hpp"
#include "simt_host.hpp"  // host emulation of the device code, for CI without a GPU
#include "simt_traffic.hpp"
#include "simt_warp.hpp"

#include <source_location>
#define KVMM_SITE_PARAM , std::source_location site = std::source_location::current()
#define KVMM_SITE_LINE site.line()
#else
#include <cuda_runtime.h>
#define KVMM_SITE_PARAM
#endif

#include <cstdint>

namespace kvmm::kernels::device {

__device__ __forceinline__ uint4 ldg16(const void* p KVMM_SITE_PARAM) {
#if defined(KVMM_SIMT_HOST)
  simt::note_access(p, 16, simt::Space::kGlobal, simt::Kind::kLoad, KVMM_SITE_LINE);
#endif
  return __ldg(static_cast<const uint4*>(p));
}

// Read-only global load of 4 or 8 bytes (page ids, kv lengths, Q words), logged like ldg16.
template <typename V>
__device__ __forceinline__ V ldg(const V* p KVMM_SITE_PARAM) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8);
#if defined(KVMM_SIMT_HOST)
  simt::note_access(p, sizeof(V), simt::Space::kGlobal, simt::Kind::kLoad, KVMM_SITE_LINE);
#endif
  return __ldg(p);
}

__device__ __forceinline__ uint4 ldg16_if(const void* p, bool pred KVMM_SITE_PARAM) {
#if defined(KVMM_SIMT_HOST)
  simt::note_access(p, pred ? 16 : 0, simt::Space::kGlobal, simt::Kind::kLoad, KVMM_SITE_LINE);
#endif
  return pred ? __ldg(static_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

template <typename V>
__device__ __forceinline__ V lds(const V* p KVMM_SITE_PARAM) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16);
#if defined(KVMM_SIMT_HOST)
  simt::note_access(p, sizeof(V), simt::Space::kShared, simt::Kind::kLoad, KVMM_SITE_LINE);
#endif
  return *p;
}

template <typename V>
__device__ __forceinline__ void sts(V* p, const V& v KVMM_SITE_PARAM) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16);
#if defined(KVMM_SIMT_HOST)
  simt::note_access(p, sizeof(V), simt::Space::kShared, simt::Kind::kStore, KVMM_SITE_LINE);
#endif
  *p = v;
}

template <int Bytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem,
                                         std::uint32_t src_bytes = Bytes KVMM_SITE_PARAM) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(KVMM_SIMT_HOST)
  simt::note_access(gmem, src_bytes < Bytes ? src_bytes : Bytes, simt::Space::kGlobal, simt::Kind::kLoad,
                    KVMM_SITE_LINE);
  simt::note_access(smem, Bytes, simt::Space::kShared, simt::Kind::kStore, KVMM_SITE_LINE);
  simt::AsyncCopies::get().issue(smem, gmem, Bytes, src_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(Bytes), "r"(src_bytes)
                 : "memory");
  }
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(KVMM_SIMT_HOST)
  simt::AsyncCopies::get().commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(Pending >= 0 && Pending < 8);
#if defined(KVMM_SIMT_HOST)
  simt::AsyncCopies::get().wait(Pending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

// A 4-byte global store of a word another CTA reads through ldcg (not logged as traffic).
template <typename V>
__device__ __forceinline__ void stg(V* p, const V& v) {
  static_assert(sizeof(V) == 4);
#if defined(KVMM_SIMT_HOST)
  simt::GlobalOrder::get().store(p, sizeof(V));
#endif
  *p = v;
}

// A 4-byte global load at L2 (ld.global.cg: no stale L1 or read-only-cache line) of a word
// another CTA stored through stg.
template <typename V>
__device__ __forceinline__ V ldcg(const V* p) {
  static_assert(sizeof(V) == 4);
#if defined(KVMM_SIMT_HOST)
  V v;
  simt::GlobalOrder::get().load(p, sizeof(V), &v);
  return v;
#else
  return __ldcg(p);
#endif
}

}  // namespace kvmm::kernels::device
