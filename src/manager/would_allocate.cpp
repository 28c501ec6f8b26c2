// KVCacheManager::would_allocate: whether allocate(r, n, lookahead) would succeed now, as a
// pure query (vLLM's full_sequence_must_fit admission gate, a watermark). It runs
// allocate's own all-or-nothing check alone: a pending hit is pinned, the need counted and
// the feasibility replayed, and the hit given back exactly as a refused allocate gives it
// back (list entries and keys as the lookup found them; only stale entries may be dropped,
// which changes no order). Cost: allocate's check, O(groups) mostly, O(pages needed) for
// the replay, plus O(hit pages) to pin and give back an admission's hit.
#include "manager_core.hpp"

namespace kvmm::detail {

bool ManagerCore::would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  const std::uint32_t s = running(r);
  Request& q = reqs_[s];
  const std::uint64_t target = q.computed + num_new_tokens + lookahead;
  if (target > KVCacheManager::kMaxTokens)
    fail("num_new_tokens = {}, lookahead = {}: request {} would hold {} tokens, at most {}", num_new_tokens, lookahead,
         r, target, KVCacheManager::kMaxTokens);
  if (q.loading) [[unlikely]]
    loading_error(r, "would_allocate");
  if (q.tier_pending) fail("request = {}: would_allocate of a pending tier hit is not supported", r);
  if (pool_.has_source()) fail("would_allocate: not supported with a large_page_source (allocate decides the backing)");
  const bool pinning = q.hit_pending;
  if (pinning && !admit(r, s, q)) return false;  // the hit was evicted: allocate returns kHitLost
  const bool images = pin_cached_images(s, q);   // as allocate: cached images count as had
  const bool fits = !compute_need(s, q, num_new_tokens, target) || alloc_.feasible(s, need_);
  give_back_admission(s, q, pinning, images);
  expensive_check();
  return fits;
}

}  // namespace kvmm::detail

namespace kvmm {

bool KVCacheManager::would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  return core_->would_allocate(r, num_new_tokens, lookahead);
}

}  // namespace kvmm
