// TierAdmission: a KVCacheManager's admissions with hits from a shared KV tier (KVTier,
// docs/tier.md), kept outside the manager as vLLM keeps its KV connector outside its cache
// manager. A companion over a manager it does not own: it holds a reference and no state
// of its own (every request's tier hit lives in the manager's row), so any number may be
// made and dropped. Each call costs the manager's work plus one indirection; the costs
// are on the calls below. Single-threaded, as the manager.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/tier_key.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvmm {

// A page a tier hit loads: the key it is stored under and the device page allocate took
// for it (small_page_bytes(key.group) bytes).
struct TierLoad {
  TierKey key;
  PageId page = kNullPage;
};

// The engine asks the tier once per admission, then admits and loads:
//   kv.lookup_prefix(r); adm.tier_candidates(r, keys); tier.contains(keys)   (step t)
//   ... when the contains completes (step t' >= t):
//   adm.extend_prefix(r, statuses); kv.allocate(r, n); tier.get(pages of adm.tier_loads(r))
//   ... when the get completes: adm.finish_loads(r, statuses)
// Between the allocate and finish_loads the request is loading: its tier pages are
// allocated, not computed (num_computed is the local part), and every manager call but
// finish_loads, free, reset and the queries raises kvmm::Error for it. The engine must
// not free or reset a request while copies into its pages are in flight.
class TierAdmission {
 public:
  explicit TierAdmission(KVCacheManager& kv) : kv_(&kv) {}
  KVCacheManager& manager() const { return *kv_; }

  // After lookup_prefix(r), before its first allocate: appends the keys of r's full prompt
  // pages past the local hit that a longer hit could need, every decoder group's in page
  // order, group after group (encoder-token groups: none; their pages come from the local
  // cache only). Returns how many; r remembers the range for extend_prefix. O(pages past
  // the hit x groups).
  std::size_t tier_candidates(RequestId r, std::vector<TierKey>& out);
  // With the tier's contains() statuses for exactly those keys (kOk: present; any other:
  // absent): looks r up again (pages may have left the local cache since) and extends the
  // hit with the tier's pages, every group's policy deciding which pages a hit needs; each
  // page comes from the local cache when it holds it, else from the tier. Returns the new
  // hit (>= the local one). Call it instead of a second lookup_prefix, in the step of the
  // allocate that admits r (as lookup_prefix). O(pages probed).
  std::uint64_t extend_prefix(RequestId r, std::span<const TierStatus> present);
  // After the allocate that admitted a tier hit: the pages to fetch, each a fresh device
  // page of small_page_bytes(group) bytes, in group order; empty when nothing is loading.
  std::span<const TierLoad> tier_loads(RequestId r) const;
  bool is_loading(RequestId r) const;
  // The loads' outcomes, one per tier_loads(r) entry in that order. The hit becomes the
  // longest prefix every group serves from its local pages and its kOk loads (all of it
  // when every load is kOk); those pages are committed as computed (cached, KV events as
  // for a commit) and every page past it is released: allocated shrinks to it, so after a
  // failure the engine calls allocate again for the tokens to recompute. No failed page
  // is ever cached. Returns num_computed(r). O(pages of the hit).
  std::uint64_t finish_loads(RequestId r, std::span<const TierStatus> statuses);
  // The block hashes of r's full pages known so far in decoder group g (its hash class's
  // chain): hashes[i] keys page i in a KVTier. O(1).
  std::span<const BlockHash> block_hashes(RequestId r, GroupId g) const;

 private:
  KVCacheManager* kv_;
};

}  // namespace kvmm
