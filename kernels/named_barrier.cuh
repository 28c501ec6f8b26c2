// Named barriers for warp-specialised kernels (a producer warp beside consumer warps),
// one API on the device (bar.sync / bar.arrive) and the host emulation (simt_host.hpp):
//   bar_sync(id, count)    waits until `count` threads (a multiple of 32) have arrived at
//                          barrier `id` (1..15; 0 is __syncthreads), itself included
//   bar_arrive(id, count)  counts this thread as arrived without waiting (the producer
//                          side of a full/empty pair)
// Costs one instruction on the device; on the host a fiber switch for bar_sync.
#pragma once

#include "memory.cuh"

namespace kvmm::kernels::device {

__device__ __forceinline__ void bar_sync(unsigned id, unsigned count) {
#if defined(KVMM_SIMT_HOST)
  simt::Emulator::get().named_sync(id, count);
#else
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void bar_arrive(unsigned id, unsigned count) {
#if defined(KVMM_SIMT_HOST)
  simt::Emulator::get().named_arrive(id, count);
#else
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

}  // namespace kvmm::kernels::device
