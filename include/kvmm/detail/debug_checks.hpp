// Debug checks in tiers, as mimalloc's mi_assert / mi_assert_internal / mi_assert_expensive.
// KVMM_DEBUG_CHECKS (CMake -DKVMM_DEBUG_CHECKS=0..3, default 0):
//   1  cheap argument and state asserts on hot paths (O(1) each);
//   2  internal consistency: every fast path is checked against its generic path (the
//      O(groups) feasibility bounds against the replay, the in-order full-attention probe
//      against the policy's longest_valid_prefix, ...);
//   3  the full recount: check_invariants() after every public call that changes state
//      (O(memory) each; what CI's sanitizer build runs).
// Off (0) they cost nothing: the conditions are not evaluated.
// One assertion family, by tier: KVMM_ASSERT (1), KVMM_ASSERT_INTERNAL (2) and
// KVMM_ASSERT_EXPENSIVE (3) raise kvmm::Error("debug check: ...") with the failed
// condition, its file and line, when their tier is on; below it they compile to nothing
// (the condition is discarded unevaluated, inside `if constexpr`).
#pragma once

#include "kvmm/error.hpp"

#ifndef KVMM_DEBUG_CHECKS
#define KVMM_DEBUG_CHECKS 0
#endif

namespace kvmm::detail {

inline constexpr int kDebugChecks = KVMM_DEBUG_CHECKS;
inline constexpr bool kCheckCheap = kDebugChecks >= 1;
inline constexpr bool kCheckInternal = kDebugChecks >= 2;
inline constexpr bool kCheckExpensive = kDebugChecks >= 3;

[[noreturn, gnu::cold]] inline void assert_failed(const char* cond, const char* file, int line) {
  fail("debug check: {} ({}:{})", cond, file, line);
}

}  // namespace kvmm::detail

#define KVMM_ASSERT_TIER_(on, cond)                               \
  do {                                                            \
    if constexpr (on) {                                           \
      if (!(cond)) [[unlikely]]                                   \
        ::kvmm::detail::assert_failed(#cond, __FILE__, __LINE__); \
    }                                                             \
  } while (false)
#define KVMM_ASSERT(cond) KVMM_ASSERT_TIER_(::kvmm::detail::kCheckCheap, cond)
#define KVMM_ASSERT_INTERNAL(cond) KVMM_ASSERT_TIER_(::kvmm::detail::kCheckInternal, cond)
#define KVMM_ASSERT_EXPENSIVE(cond) KVMM_ASSERT_TIER_(::kvmm::detail::kCheckExpensive, cond)
