// Debug checks in tiers, as mimalloc's mi_assert / mi_assert_internal / mi_assert_expensive.
// KVMM_DEBUG_CHECKS (CMake -DKVMM_DEBUG_CHECKS=0..3, default 0):
//   1  cheap argument and state asserts on hot paths (O(1) each);
//   2  internal consistency: every fast path is checked against its generic path (the
//      O(groups) feasibility bounds against the replay, the in-order full-attention probe
//      against the policy's longest_valid_prefix, ...);
//   3  the full recount: check_invariants() after every public call that changes state
//      (O(memory) each; what CI's sanitizer build runs).
// Off (0) they cost nothing: the conditions are not evaluated.
#pragma once

#ifndef KVMM_DEBUG_CHECKS
#define KVMM_DEBUG_CHECKS 0
#endif

namespace kvmm::detail {

inline constexpr int kDebugChecks = KVMM_DEBUG_CHECKS;
inline constexpr bool kCheckCheap = kDebugChecks >= 1;
inline constexpr bool kCheckInternal = kDebugChecks >= 2;
inline constexpr bool kCheckExpensive = kDebugChecks >= 3;

}  // namespace kvmm::detail
