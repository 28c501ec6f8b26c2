// The one switch for software prefetching: every prefetch kvmm issues goes through
// kvmm::detail::prefetch_read / prefetch_write. KVMM_PREFETCH=0 (CMake -DKVMM_PREFETCH=OFF)
// turns them into nothing, so the plain path can be built, tested and timed against the
// prefetching one. A prefetch is a hint: it never changes a result. Cost: one
// instruction each when on.
#pragma once

#ifndef KVMM_PREFETCH
#define KVMM_PREFETCH 1
#endif

namespace kvmm::detail {

inline constexpr bool kPrefetch = KVMM_PREFETCH != 0;

[[gnu::always_inline]] inline void prefetch_read(const void* p) {
  if constexpr (kPrefetch)
    __builtin_prefetch(p, 0);
  else
    (void)p;
}
[[gnu::always_inline]] inline void prefetch_write(const void* p) {
  if constexpr (kPrefetch)
    __builtin_prefetch(p, 1);
  else
    (void)p;
}

}  // namespace kvmm::detail
