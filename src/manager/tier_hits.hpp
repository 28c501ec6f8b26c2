// TierHits (private to src/manager/): hits from a shared tier (KVTier). tier_candidates
// lists the pages past the local hit (O(pages x groups)), extend_prefix looks r up again
// with the tier's answers (O(pages probed)), the admitting allocate adopts the local pages
// and takes a fresh page per tier page (O(hit pages)), and finish_loads commits what
// arrived, cutting the hit back to what every group can serve (O(pages of the hit)).
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class TierHits {
 public:
  explicit TierHits(ManagerCore& m) : m_(m) {}
  TierHits(const TierHits&) = delete;
  TierHits& operator=(const TierHits&) = delete;

  std::size_t tier_candidates(RequestId r, std::vector<TierKey>& out);
  std::uint64_t extend_prefix(RequestId r, std::span<const TierStatus> present);
  bool admit_tier(RequestId r, Row s, Request& q);
  void fill_tier_pages(Row s, Request& q, GroupId g);
  void start_loads(RequestId r, Row s, Request& q);
  std::uint64_t finish_loads(RequestId r, std::span<const TierStatus> statuses);
  std::uint64_t finish_loads_at(RequestId r, Row s, Request& q, std::span<const TierStatus> statuses);
  std::uint64_t servable_prefix(Row s, std::uint64_t p) const;

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
