// Host emulation of the CUDA subset the kvmm kernels use, so that CI runs the real
// device code on a machine without a GPU (define KVMM_SIMT_HOST before including a
// .cuh). Each CTA runs as blockDim.x fibers on the calling thread, switched at every
// __syncthreads and __shfl_xor_sync; a barrier that some threads of a CTA reach while
// others exited or wait at a different barrier is reported as divergence (on a GPU:
// a hang or undefined shuffle results). A barrier costs microseconds: small shapes only.
#pragma once

#include "kvmm/kernels/dtype.hpp"

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};
struct __half {
  unsigned short bits;
};
struct __nv_bfloat16 {
  unsigned short bits;
};

inline uint4 make_uint4(unsigned int a, unsigned int b, unsigned int c, unsigned int d) { return uint4{a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline __half __ushort_as_half(unsigned short v) { return __half{v}; }
inline float __half2float(__half h) { return kvmm::kernels::f16_to_float(h.bits); }
inline __half __float2half_rn(float f) { return __half{kvmm::kernels::float_to_f16(f)}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{kvmm::kernels::float_to_bf16(f)}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace kvmm::simt {

class Emulator {
 public:
  static Emulator& get() {
    static Emulator e;
    return e;
  }

  // Runs `body` as one CTA (blockIdx, blockDim, gridDim set by the caller). Returns false
  // if its threads diverged at a barrier (the CTA is then abandoned).
  bool run_block(const std::function<void()>& body) {
    const unsigned n = blockDim.x;
    if (fibers_.size() < n) fibers_.resize(n);
    xchg_.assign(n, 0.0f);
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      if (!f.stack) f.stack = std::make_unique<char[]>(kStackBytes);
      f.started = false;
      f.done = false;
      getcontext(&f.start);
      f.start.uc_stack.ss_sp = f.stack.get();
      f.start.uc_stack.ss_size = kStackBytes;
      f.start.uc_link = nullptr;
      makecontext(&f.start, &Emulator::entry, 0);
    }
    body_ = &body;
    for (;;) {
      // One round: every live thread runs up to its next barrier or its end.
      unsigned waiting = 0, exited = 0;
      int site = -1;
      bool mismatch = false;
      for (unsigned i = 0; i < n; ++i) {
        if (fibers_[i].done) continue;
        resume(i);
        if (fibers_[i].done) {
          ++exited;
        } else {
          if (waiting > 0 && fibers_[i].site != site) mismatch = true;
          site = fibers_[i].site;
          ++waiting;
        }
      }
      if (waiting == 0) return true;
      if (exited > 0 || mismatch) return false;
    }
  }

  // Runs thread i until its next barrier or its end. Out of line, so that no local of
  // run_block lives across the jumps.
  [[gnu::noinline]] void resume(unsigned i) {
    current_ = i;
    threadIdx = dim3(i);
    Fiber& f = fibers_[i];
    if (_setjmp(main_) == 0) {
      if (!f.started) {
        f.started = true;
        setcontext(&f.start);
      } else {
        _longjmp(f.ctx, 1);
      }
    }
  }

  void barrier(int site) {
    Fiber& f = fibers_[current_];
    f.site = site;
    if (_setjmp(f.ctx) == 0) _longjmp(main_, 1);
  }

  float shfl_xor(float v, int lane_mask) {
    const unsigned me = current_;
    xchg_[me] = v;
    barrier(1000 + lane_mask);
    const float r = xchg_[me ^ static_cast<unsigned>(lane_mask)];
    barrier(2000 + lane_mask);
    return r;
  }

 private:
  static constexpr std::size_t kStackBytes = 128 * 1024;
  struct Fiber {
    std::unique_ptr<char[]> stack;
    jmp_buf ctx;
    ucontext_t start;
    bool started = false;
    bool done = false;
    int site = 0;
  };
  static void entry() {
    Emulator& e = get();
    (*e.body_)();
    e.fibers_[e.current_].done = true;
    _longjmp(e.main_, 1);
  }

  std::vector<Fiber> fibers_;
  std::vector<float> xchg_;
  jmp_buf main_;
  unsigned current_ = 0;
  const std::function<void()>* body_ = nullptr;
};

// Runs every CTA of `grid` with `threads` threads; false on divergence.
inline bool launch(dim3 grid, unsigned threads, const std::function<void()>& body) {
  gridDim = grid;
  blockDim = dim3(threads);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        if (!Emulator::get().run_block(body)) return false;
      }
  return true;
}

}  // namespace kvmm::simt

inline void __syncthreads() { kvmm::simt::Emulator::get().barrier(1); }
inline float __shfl_xor_sync(unsigned int, float v, int lane_mask) {
  return kvmm::simt::Emulator::get().shfl_xor(v, lane_mask);
}
