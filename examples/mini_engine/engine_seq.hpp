// Engine::Seq, one sampled sequence of the paged engine: shared by engine.cpp (the
// scheduler) and tier.cpp (its KVTier part). Private to the mini engine.
#pragma once

#include "mini_engine.hpp"

namespace mini {

// One sampled sequence. A forked sample is a Seq of its own with its own RequestId.
struct Engine::Seq {
  std::uint32_t request = 0, sample = 0, rank = 0, pending_forks = 0, max_new = 0, prompt_len = 0;
  std::vector<std::uint32_t> tokens;  // prompt + generated
  kvmm::RequestId rid = kvmm::kNoRequest;
  std::uint64_t computed = 0;     // tokens with KV in the cache
  std::uint64_t prefill_end = 0;  // tokens known when admitted: computing them is prefill
  bool finished = false;
  // With a tier: kNone, then (waiting, registered and looked up) kProbing while its
  // contains is in flight, kProbed once answered; admitted with loads: kLoading until the get
  // completes. tier_hit: the extended hit while loading.
  enum class TierPhase : std::uint8_t { kNone, kProbing, kProbed, kLoading } tier = TierPhase::kNone;
  std::uint64_t tier_hit = 0;
  std::vector<kvmm::TierKey> tier_keys;
  std::vector<kvmm::TierStatus> tier_status;  // the contains' answer, one per tier_keys entry
};

}  // namespace mini
