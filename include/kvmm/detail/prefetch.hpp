// The one switch for software prefetching: every prefetch kvmm issues goes through
// kvmm::detail::prefetch_read / prefetch_write. KVMM_PREFETCH=0 (CMake -DKVMM_PREFETCH=OFF)
// turns them into nothing, so the plain path can be built, tested and timed against the
// prefetching one. A prefetch is a hint: it never changes a result. Cost: one
// instruction each when on.
//
// Why an asm statement and not only __builtin_prefetch: GCC treats the builtin as free of
// side effects, so a helper that does nothing but prefetch (prefetch_release, the victim
// ring's stages) is found "pure" by its IPA pass when it is not inlined early, and every
// call to it is deleted as dead code. That silently removed the manager's release-ahead
// after the split (issue 16: the 10k arXiv replay ran 1.38x slower than the monolith). A
// volatile asm cannot be deleted; it names only the address (no memory clobber), so it
// orders nothing and costs the same one instruction.
#pragma once

#ifndef KVMM_PREFETCH
#define KVMM_PREFETCH 1
#endif

namespace kvmm::detail {

inline constexpr bool kPrefetch = KVMM_PREFETCH != 0;

[[gnu::always_inline]] inline void prefetch_read(const void* p) {
  if constexpr (kPrefetch) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(__aarch64__)
    asm volatile("prfm pldl1keep, %0" : : "Q"(*static_cast<const char*>(p)));
#else
    __builtin_prefetch(p, 0);
#endif
  } else {
    (void)p;
  }
}
[[gnu::always_inline]] inline void prefetch_write(const void* p) {
  if constexpr (kPrefetch) {
    // x86-64 without PRFCHW (the baseline ISA) has no write prefetch: GCC emits prefetcht0
    // for __builtin_prefetch(p, 1) too.
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(__aarch64__)
    asm volatile("prfm pstl1keep, %0" : : "Q"(*static_cast<const char*>(p)));
#else
    __builtin_prefetch(p, 1);
#endif
  } else {
    (void)p;
  }
}

}  // namespace kvmm::detail
