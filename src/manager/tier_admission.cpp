// TierAdmission: the tier calls, each forwarded to the manager's core (tier_hits.cpp keeps
// the logic). The cost of a call is the core's plus one indirection.
#include "kvmm/manager/tier_admission.hpp"

#include "manager_core.hpp"

namespace kvmm {

std::size_t TierAdmission::tier_candidates(RequestId r, std::vector<TierKey>& out) {
  return kv_->core_->tier.tier_candidates(r, out);
}
std::uint64_t TierAdmission::extend_prefix(RequestId r, std::span<const TierStatus> present) {
  return kv_->core_->tier.extend_prefix(r, present);
}
std::span<const TierLoad> TierAdmission::tier_loads(RequestId r) const { return kv_->core_->req(r).tier.loads; }
bool TierAdmission::is_loading(RequestId r) const { return kv_->core_->req(r).loading(); }
std::uint64_t TierAdmission::finish_loads(RequestId r, std::span<const TierStatus> statuses) {
  return kv_->core_->tier.finish_loads(r, statuses);
}
std::span<const BlockHash> TierAdmission::block_hashes(RequestId r, GroupId g) const {
  return kv_->core_->block_hashes(r, g);
}

}  // namespace kvmm
