// TierKey and TierStatus: the words the prefix cache and a shared KV tier (distributed/kv_tier.hpp)
// share. A key names one page of one group by its block hash; a status is what the tier
// answered for it. Plain values, no cost.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/types.hpp"

#include <cstdint>

namespace kvmm {

struct TierKey {  // one page of one group
  GroupId group = 0;
  BlockHash hash;
  friend bool operator==(const TierKey&, const TierKey&) = default;
};

enum class TierStatus : std::uint8_t {
  kOk,           // contains: present; get: verified bytes copied; put: stored (or already was); remove: deleted
  kMiss,         // not in the tier (never stored, evicted, removed)
  kCorrupt,      // get: the value failed verification; it was deleted and the page left untouched
  kTimeout,      // no answer within the command timeout
  kUnavailable,  // no usable server: connection failed or lost, circuit breaker open, server error
};

}  // namespace kvmm
