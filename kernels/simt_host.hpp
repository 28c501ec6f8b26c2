// Host emulation of the CUDA subset the kvmm kernels use, so that CI runs the real
// device code on a machine without a GPU (define KVMM_SIMT_HOST before including a
// .cuh). Each CTA runs as blockDim.x fibers on the calling thread, switched at every
// barrier and warp-wide instruction; a barrier that some threads of a CTA reach while
// others exited or wait at a different barrier is reported as divergence (on a GPU:
// a hang or undefined shuffle results). A barrier costs microseconds: small shapes only.
// Scheduling is per warp: a thread runs until it waits at a CTA barrier (__syncthreads),
// a warp rendezvous or a named barrier (bar.sync/bar.arrive), or ends; a warp rendezvous
// releases when all lanes of that warp reached the same one, so warps may run different
// collectives (warp specialisation: a producer warp beside consumer warps). Warp-wide
// instructions (shuffles, __syncwarp; mma and ldmatrix in simt_warp.hpp) deposit a
// 64-byte record per lane, rendezvous, compute each lane's result from the warp's records
// and rendezvous again. Lanes of one warp at different collectives, a collective or CTA
// barrier that some lanes left by exiting, or a wait nothing can release are reported.
// A seeded schedule (set_schedule_seed) permutes the order in which the threads of a CTA
// run between barriers, so an ordering bug shows up under one of several seeds; a seeded
// block order (set_block_order_seed) permutes the order in which the CTAs of a grid run
// (one after another), so the CTA that arrives last at a cross-CTA hand-off differs
// (global atomics, fences and their visibility model: simt_global.hpp).
#pragma once

#include "kvmm/kernels/dtype.hpp"

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <random>
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

// What one lane deposits at a warp rendezvous: registers and one pointer.
struct LaneRecord {
  std::uint32_t r[8];
  float f[4];
  const void* p;
  std::uint64_t pad;
};

// Hooks run at the start and end of each CTA (the cp.async queue of simt_warp.hpp, the
// mbarrier and wgmma state of simt_hopper.hpp): every registered pair runs.
struct BlockHooks {
  void (*begin)(unsigned threads) = nullptr;
  void (*end)() = nullptr;
};

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
    lanes_.assign((n + 31) / 32 * 32, LaneRecord{});  // whole warps: a partial warp's missing lanes read zeros
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0u);
    for (const BlockHooks& h : hooks_)
      if (h.begin != nullptr) h.begin(n);
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
    named_arrived_.fill(0);
    named_count_.fill(0);
    for (unsigned i = 0; i < n; ++i) fibers_[i].runnable = true;
    bool ok = true;
    for (;;) {
      // One round: every runnable thread runs up to its next wait or its end, in thread
      // order or in a seeded permutation of it; then whatever can be released is.
      if (seed_ != 0) std::shuffle(order_.begin(), order_.end(), rng_);
      for (unsigned i : order_) {
        Fiber& f = fibers_[i];
        if (f.done || !f.runnable) continue;
        f.runnable = false;
        resume(i);
      }
      const int r = release(n);
      if (r == 0) break;  // every thread ended
      if (r < 0) {
        ok = false;
        break;
      }
    }
    for (const BlockHooks& h : hooks_)
      if (h.end != nullptr) h.end();
    return ok;
  }

  // After a round: releases the warps whose live lanes all wait at one warp collective,
  // the named barriers that enough threads reached, else the CTA barrier if every live
  // thread waits at it. 1: something released; 0: every thread ended; -1: divergence
  // (lanes of a warp at different collectives or with exited lanes, threads at different
  // CTA barriers or exited ones) or deadlock (nothing can be released).
  int release(unsigned n) {
    unsigned live = 0, at_cta = 0;
    bool any_done = false, cta_mismatch = false;
    int cta_site = -1;
    for (unsigned i = 0; i < n; ++i) {
      const Fiber& f = fibers_[i];
      if (f.done) {
        any_done = true;
        continue;
      }
      ++live;
      if (f.wait == Wait::kCta) {
        if (at_cta > 0 && f.site != cta_site) cta_mismatch = true;
        cta_site = f.site;
        ++at_cta;
      }
    }
    if (live == 0) return 0;
    bool released = false;
    for (unsigned lo = 0; lo < n; lo += 32) {
      const unsigned hi = std::min(n, lo + 32);
      bool at_warp = false, elsewhere = false, exited = false, mismatch = false;
      int site = -1;
      for (unsigned i = lo; i < hi; ++i) {
        const Fiber& f = fibers_[i];
        if (f.done) {
          exited = true;
        } else if (f.wait == Wait::kWarp) {
          if (at_warp && f.site != site) mismatch = true;
          site = f.site;
          at_warp = true;
        } else {
          elsewhere = true;
        }
      }
      if (!at_warp) continue;
      if (mismatch || exited || elsewhere) return -1;
      for (unsigned i = lo; i < hi; ++i) fibers_[i].runnable = true;
      released = true;
    }
    for (unsigned id = 0; id < kNamedBarriers; ++id) {
      if (named_count_[id] == 0 || named_arrived_[id] < named_count_[id]) continue;
      unsigned waiting = 0;
      for (unsigned i = 0; i < n; ++i) {
        Fiber& f = fibers_[i];
        if (!f.done && f.wait == Wait::kNamed && f.site == static_cast<int>(id)) {
          f.runnable = true;
          ++waiting;
        }
      }
      if (waiting == 0) continue;
      named_arrived_[id] -= named_count_[id];
      released = true;
    }
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      if (!f.done && f.wait == Wait::kPoll && !f.runnable && f.ready && f.ready()) {
        f.ready = nullptr;
        f.wait = Wait::kCta;  // about to run: no longer waiting at anything
        f.runnable = true;
        released = true;
      }
    }
    if (!released && at_cta == live) {
      if (cta_mismatch || any_done) return -1;
      for (unsigned i = 0; i < n; ++i) fibers_[i].runnable = !fibers_[i].done;
      ++cta_barriers_;
      released = true;
    }
    return released ? 1 : -1;
  }

  // 0 (the default): threads run in index order; else a permutation per round from `seed`.
  void set_schedule_seed(std::uint64_t seed) {
    seed_ = seed;
    rng_.seed(seed);
  }
  // 0 (the default): CTAs run in x, y, z order; else a permutation per launch from `seed`.
  void set_block_order_seed(std::uint64_t seed) {
    block_seed_ = seed;
    block_rng_.seed(seed);
  }
  std::uint64_t block_order_seed() const { return block_seed_; }
  std::mt19937_64& block_rng() { return block_rng_; }
  // The CTAs of the latest launch in the order they ran.
  std::vector<dim3>& block_order() { return block_order_; }
  void add_hooks(BlockHooks h) { hooks_.push_back(h); }
  unsigned current() const { return current_; }
  // CTA barriers released so far (all CTAs): a thread that runs after one was released
  // passed it, as every live thread of the CTA waited there.
  std::uint64_t cta_barriers() const { return cta_barriers_; }
  // Launches begun so far (simt::launch): memory written by an earlier launch is visible.
  std::uint64_t launches() const { return launches_; }
  void begin_launch() { ++launches_; }
  LaneRecord& record(unsigned thread) { return lanes_[thread]; }

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

  // Blocks the running thread at a CTA barrier (__syncthreads), a warp rendezvous, or a
  // named barrier (bar.sync id, count); named_arrive is bar.arrive (does not block).
  void barrier(int site) { block(Wait::kCta, site); }
  void warp_wait(int site) { block(Wait::kWarp, site); }
  void named_sync(unsigned id, unsigned count) {
    named_count_.at(id) = count;
    ++named_arrived_.at(id);
    block(Wait::kNamed, static_cast<int>(id));
  }
  // Blocks the running thread until `ready()` holds (an mbarrier phase, a flag another
  // thread sets); re-evaluated after every round. Nothing else runnable and no poll
  // ready: reported as a deadlock.
  void wait_until(std::function<bool()> ready) {
    if (ready()) return;
    fibers_[current_].ready = std::move(ready);
    block(Wait::kPoll, 0);
  }
  void named_arrive(unsigned id, unsigned count) {
    named_count_.at(id) = count;
    ++named_arrived_.at(id);
  }

  // A warp rendezvous: `deposit` fills this lane's record, `collect` reads the warp's
  // records (first lane's index passed) once every lane of the warp arrived.
  template <typename Deposit, typename Collect>
  void warp_collective(int site, Deposit&& deposit, Collect&& collect) {
    const unsigned me = current_;
    deposit(lanes_[me]);
    warp_wait(site);
    collect(&lanes_[me & ~31u], me & 31u);
    warp_wait(site + 1);
  }

  // Shuffle of a 32-bit value from lane `src(lane)` of the warp (src >= 32: own value).
  template <typename Src>
  std::uint32_t shfl(std::uint32_t v, int site, Src&& src) {
    std::uint32_t r = v;
    warp_collective(
        site, [&](LaneRecord& rec) { rec.r[0] = v; },
        [&](const LaneRecord* warp, unsigned lane) {
          const unsigned from = src(lane);
          if (from < 32) r = warp[from].r[0];
        });
    return r;
  }

 private:
  static constexpr std::size_t kStackBytes = 128 * 1024;
  static constexpr unsigned kNamedBarriers = 16;
  enum class Wait : std::uint8_t { kCta, kWarp, kNamed, kPoll };
  void block(Wait w, int site) {
    Fiber& f = fibers_[current_];
    f.wait = w;
    f.site = site;
    if (_setjmp(f.ctx) == 0) _longjmp(main_, 1);
  }
  struct Fiber {
    std::unique_ptr<char[]> stack;
    jmp_buf ctx;
    ucontext_t start;
    bool started = false;
    bool done = false;
    bool runnable = false;
    Wait wait = Wait::kCta;
    int site = 0;
    std::function<bool()> ready;  // kPoll: released when it returns true
  };
  static void entry() {
    Emulator& e = get();
    (*e.body_)();
    e.fibers_[e.current_].done = true;
    _longjmp(e.main_, 1);
  }

  std::vector<Fiber> fibers_;
  std::vector<LaneRecord> lanes_;
  std::vector<unsigned> order_;
  std::array<unsigned, kNamedBarriers> named_arrived_{}, named_count_{};
  std::uint64_t seed_ = 0, block_seed_ = 0, cta_barriers_ = 0, launches_ = 0;
  std::mt19937_64 rng_, block_rng_;
  std::vector<dim3> block_order_;
  std::vector<BlockHooks> hooks_;
  jmp_buf main_;
  unsigned current_ = 0;
  const std::function<void()>* body_ = nullptr;
};

// Runs every CTA of `grid` with `threads` threads, one after another, in x, y, z order or
// in the seeded block order's permutation; false on divergence.
inline bool launch(dim3 grid, unsigned threads, const std::function<void()>& body) {
  Emulator& e = Emulator::get();
  e.begin_launch();
  gridDim = grid;
  blockDim = dim3(threads);
  std::vector<dim3>& blocks = e.block_order();
  blocks.clear();
  blocks.reserve(std::size_t{grid.x} * grid.y * grid.z);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) blocks.emplace_back(x, y, z);
  if (e.block_order_seed() != 0) std::shuffle(blocks.begin(), blocks.end(), e.block_rng());
  for (const dim3& idx : blocks) {
    blockIdx = idx;
    if (!e.run_block(body)) return false;
  }
  return true;
}

// The running CTA's dynamic shared memory (extern __shared__ on the device): one
// 1024-byte aligned buffer, grown to the largest size asked, shared by every CTA in turn.
inline unsigned char* dynamic_shared(std::size_t bytes) {
  struct Free {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{1024}); }
  };
  static std::unique_ptr<unsigned char[], Free> buf;
  static std::size_t size = 0;
  if (bytes > size) {
    buf.reset(static_cast<unsigned char*>(::operator new[](bytes, std::align_val_t{1024})));
    size = bytes;
  }
  return buf.get();
}

}  // namespace kvmm::simt

inline void __syncthreads() { kvmm::simt::Emulator::get().barrier(1); }
inline void __syncwarp(unsigned int = 0xffffffffu) { kvmm::simt::Emulator::get().warp_wait(5); }

// Shuffles over the full warp (width 32) of 32-bit values: float, int, unsigned.
namespace kvmm::simt {
template <typename V>
inline std::uint32_t bits_of(V v) {
  static_assert(sizeof(V) == 4);
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <typename V>
inline V from_bits(std::uint32_t u) {
  V v;
  std::memcpy(&v, &u, 4);
  return v;
}
}  // namespace kvmm::simt

template <typename V>
inline V __shfl_xor_sync(unsigned int, V v, int lane_mask) {
  const auto m = static_cast<unsigned>(lane_mask);
  return kvmm::simt::from_bits<V>(kvmm::simt::Emulator::get().shfl(kvmm::simt::bits_of(v), 1000 + 2 * lane_mask,
                                                                   [m](unsigned lane) { return (lane ^ m) & 31u; }));
}
template <typename V>
inline V __shfl_sync(unsigned int, V v, int src_lane) {
  const auto s = static_cast<unsigned>(src_lane) & 31u;
  return kvmm::simt::from_bits<V>(
      kvmm::simt::Emulator::get().shfl(kvmm::simt::bits_of(v), 4000, [s](unsigned) { return s; }));
}
template <typename V>
inline V __shfl_down_sync(unsigned int, V v, unsigned int delta) {
  return kvmm::simt::from_bits<V>(kvmm::simt::Emulator::get().shfl(
      kvmm::simt::bits_of(v), 4100, [delta](unsigned lane) { return lane + delta < 32 ? lane + delta : 32u; }));
}
template <typename V>
inline V __shfl_up_sync(unsigned int, V v, unsigned int delta) {
  return kvmm::simt::from_bits<V>(kvmm::simt::Emulator::get().shfl(
      kvmm::simt::bits_of(v), 4200, [delta](unsigned lane) { return lane >= delta ? lane - delta : 32u; }));
}
// Warp vote: true if any lane's predicate is true.
inline bool __any_sync(unsigned int, bool pred) {
  bool any = false;
  kvmm::simt::Emulator::get().warp_collective(
      4300, [&](kvmm::simt::LaneRecord& rec) { rec.r[0] = pred ? 1u : 0u; },
      [&](const kvmm::simt::LaneRecord* warp, unsigned) {
        for (unsigned l = 0; l < 32; ++l) any = any || warp[l].r[0] != 0;
      });
  return any;
}
// Warp vote: bit l set if lane l's predicate is true.
inline unsigned int __ballot_sync(unsigned int, bool pred) {
  unsigned int bits = 0;
  kvmm::simt::Emulator::get().warp_collective(
      4310, [&](kvmm::simt::LaneRecord& rec) { rec.r[0] = pred ? 1u : 0u; },
      [&](const kvmm::simt::LaneRecord* warp, unsigned) {
        for (unsigned l = 0; l < 32; ++l) bits |= (warp[l].r[0] != 0 ? 1u : 0u) << l;
      });
  return bits;
}
