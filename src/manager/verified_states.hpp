// VerifiedStates (private to src/manager/): recurrent-state checkpoints under speculative
// decoding. In a group with LayerGroup::tagged_checkpoints a checkpoint page is cached only
// when the engine tags it with the exact verified token count the state holds (tag_state),
// never because the verified tokens passed it: a state written in a step with drafts may
// hold rejected tokens. A tag past the verified (committed) tokens is refused, so no
// cached state covers an unverified position, and rolling drafts back (a commit of fewer
// tokens than were computed) leaves every cached state valid. O(1) a tag.
#pragma once

#include "kvmm/types.hpp"

#include <cstdint>

namespace kvmm::detail {

class ManagerCore;

class VerifiedStates {
 public:
  explicit VerifiedStates(ManagerCore& m) : m_(m) {}
  VerifiedStates(const VerifiedStates&) = delete;
  VerifiedStates& operator=(const VerifiedStates&) = delete;

  // Group g's state page of r holds exactly the state after positions [0, state_tokens):
  // when these are all verified (state_tokens <= r's committed tokens), a checkpoint (a
  // multiple of the interval C) and the page is still r's, it is cached under the prefix's
  // hash; true when its content is cached now. false (refused, nothing changed) for a state
  // that covers a position not verified yet. kvmm::Error (nothing changed) for a group
  // without tagged checkpoints, state_tokens = 0, or state_tokens past r's allocated tokens.
  bool tag(RequestId r, GroupId g, std::uint64_t state_tokens);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
