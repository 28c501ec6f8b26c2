// Global atomics, __threadfence and a visibility model of cross-CTA hand-offs for the host
// emulation (simt_host.hpp). CTAs run one after another there, so every store of a CTA is
// in memory before a later CTA runs; what the device does not promise is modelled
// instead, per 4-byte word written through stg() (memory.cuh):
//   - a store is *published* to other CTAs only when its thread ran __threadfence() after
//     it and then a thread of its CTA ran a global atomic (the arrival at a counter) after
//     that fence: the same thread, or any thread once a CTA barrier separated them;
//   - a load through ldcg() of a word another CTA wrote counts only after the loading CTA
//     *acquired*: one of its threads ran an atomic and then __threadfence(), and the loading
//     thread is that one or passed a CTA barrier since; a word its own CTA wrote, only for
//     the writing thread or after a CTA barrier since the store;
//   - anything else is a violation: counted (violations()) and the load returns NaN bits,
//     so a kernel that skips a fence or a barrier fails its comparison with a reference.
// Words written by an earlier launch are visible (a kernel boundary orders everything).
// Loads through ldg() (ld.global.nc, which may serve stale data written during the
// kernel) are not tracked: kernels read other CTAs' words through ldcg() only. Atomics
// are serial (CTAs do not overlap). Cost: a hash-map entry per stored word.
#pragma once

#include "simt_host.hpp"

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace kvmm::simt {

class GlobalOrder {
 public:
  static GlobalOrder& get() {
    static GlobalOrder g;
    return g;
  }

  // A store of `bytes` at `p` by the running thread (the value is written by the caller).
  void store(const void* p, std::size_t bytes) {
    sync_launch();
    const unsigned t = threadIdx.x;
    for (std::uintptr_t w = word(p); w < word(p) + bytes / 4; ++w) {
      words_[w] = Word{cta(), t, false, false, 0, Emulator::get().cta_barriers()};
      if (pending_.size() <= t) pending_.resize(t + 1);
      pending_[t].push_back(w);
    }
  }

  // A load of `bytes` at `p` by the running thread into `out`: the memory, or NaN bits
  // where the model says the word may not be visible yet.
  void load(const void* p, std::size_t bytes, void* out) {
    sync_launch();
    std::memcpy(out, p, bytes);
    const unsigned t = threadIdx.x;
    const std::uint64_t epoch = Emulator::get().cta_barriers();
    for (std::size_t i = 0; i < bytes / 4; ++i) {
      const auto it = words_.find(word(p) + i);
      if (it == words_.end()) continue;  // not written during this launch
      const Word& w = it->second;
      const bool ok = w.cta == cta() ? (w.thread == t || w.store_epoch < epoch)
                                     : w.published && acquired_ && (acq_thread_ == t || acq_epoch_ < epoch);
      if (!ok) {
        ++violations_;
        const std::uint32_t nan = 0x7fc00000u;
        std::memcpy(static_cast<char*>(out) + 4 * i, &nan, 4);
      }
    }
  }

  // __threadfence() by the running thread: its stores so far become fenced; after an
  // atomic of this thread, the CTA acquires.
  void fence() {
    sync_launch();
    const unsigned t = threadIdx.x;
    const std::uint64_t epoch = Emulator::get().cta_barriers();
    if (t < pending_.size()) {
      for (std::uintptr_t w : pending_[t]) {
        Word& x = words_.at(w);
        if (x.cta == cta() && x.thread == t && !x.fenced) {
          x.fenced = true;
          x.fence_epoch = epoch;
          fenced_.push_back(w);
        }
      }
      pending_[t].clear();
    }
    if (atomic_cta_ == cta() && atomic_thread_ == t) {
      acquired_ = true;
      acq_thread_ = t;
      acq_epoch_ = epoch;
    }
  }

  // A global atomic by the running thread: publishes the CTA's stores fenced by this thread
  // or before the last CTA barrier.
  void atomic() {
    sync_launch();
    const unsigned t = threadIdx.x;
    const std::uint64_t epoch = Emulator::get().cta_barriers();
    std::vector<std::uintptr_t> keep;
    for (std::uintptr_t w : fenced_) {
      Word& x = words_.at(w);
      if (x.cta != cta()) continue;
      if (x.thread == t || x.fence_epoch < epoch)
        x.published = true;
      else
        keep.push_back(w);
    }
    fenced_ = std::move(keep);
    atomic_cta_ = cta();
    atomic_thread_ = t;
  }

  long long violations() const { return violations_; }
  void reset_violations() { violations_ = 0; }

 private:
  struct Word {
    std::uint64_t cta;
    unsigned thread;
    bool fenced, published;
    std::uint64_t fence_epoch, store_epoch;
  };
  static std::uintptr_t word(const void* p) { return reinterpret_cast<std::uintptr_t>(p) / 4; }
  static std::uint64_t cta() {
    return (std::uint64_t{blockIdx.z} * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x + 1;
  }
  // A new launch forgets the last one's words; a new CTA its predecessor's acquire state.
  void sync_launch() {
    const std::uint64_t l = Emulator::get().launches();
    if (l != launch_) {
      launch_ = l;
      words_.clear();
      fenced_.clear();
      pending_.clear();
      cur_cta_ = 0;
    }
    if (cta() != cur_cta_) {
      cur_cta_ = cta();
      acquired_ = false;
      atomic_cta_ = 0;
      for (auto& p : pending_) p.clear();
    }
  }

  std::unordered_map<std::uintptr_t, Word> words_;
  std::vector<std::vector<std::uintptr_t>> pending_;  // per thread: stored, not yet fenced
  std::vector<std::uintptr_t> fenced_;                // fenced, not yet published
  std::uint64_t launch_ = 0, cur_cta_ = 0, atomic_cta_ = 0, acq_epoch_ = 0;
  unsigned atomic_thread_ = 0, acq_thread_ = 0;
  bool acquired_ = false;
  long long violations_ = 0;
};

}  // namespace kvmm::simt

inline void __threadfence() { kvmm::simt::GlobalOrder::get().fence(); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  kvmm::simt::GlobalOrder::get().atomic();
  const unsigned int old = *p;
  *p = old + v;
  return old;
}
inline unsigned int atomicExch(unsigned int* p, unsigned int v) {
  kvmm::simt::GlobalOrder::get().atomic();
  const unsigned int old = *p;
  *p = v;
  return old;
}
