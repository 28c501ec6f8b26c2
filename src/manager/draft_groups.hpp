// DraftGroups (private to src/manager/): speculative decoding's draft groups (an EAGLE
// head, MTP layers, a draft model; LayerGroup::draft). A draft group is looked up after the
// target's hit is decided and never shortens it: its own hit d <= p is adopted, and the
// engine recomputes the draft's positions [d, p) (draft_recompute). A draft page whose KV
// depends on the successor_tokens ids after it is keyed with them (key i = hash(chain[i],
// ids [(i+1)P, (i+1)P + s))), so the last page of a prompt is reused exactly when the next
// ids match, and is cached only once those ids are known. Keys: O(1) each, computed once
// per page; the rest O(groups).
#pragma once

#include "group.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>

namespace kvmm::detail {

class ManagerCore;

// The keys group g's pages of q are cached under: the chain of its hash class, or a
// successor-keyed draft's own keys (as many as draft_keys() computed). O(1).
inline std::span<const BlockHash> page_keys(const Request& q, const Group& grp, GroupId g) {
  if (grp.successors > 0) return q.drafts.keys[g];
  return q.ids.chain(grp.hash_class);
}

class DraftGroups {
 public:
  explicit DraftGroups(ManagerCore& m);
  DraftGroups(const DraftGroups&) = delete;
  DraftGroups& operator=(const DraftGroups&) = delete;

  // Whether some group is keyed with successor ids: requests then keep their ids.
  bool keeps_ids() const { return keyed_; }
  // Group g's keys of q for pages [0, pages), as far as the ids are known (page i needs id
  // (i+1)P + s - 1); its hash class's chain must cover them. O(new keys).
  void ensure_keys(Request& q, GroupId g, std::uint64_t pages);
  // Draft pages of q that a commit of c tokens may cache in group g: page i once (i+1)P <= c
  // and its successor ids are known. O(1).
  std::uint64_t cacheable_pages(const Request& q, GroupId g, std::uint64_t c) const;
  // Draft positions r's engine computes before the step: [its draft hit, the hit). O(1).
  TokenRange recompute(RequestId r, GroupId g) const;
  // A successor-keyed draft writes its KV at a position once the ids after it are known,
  // so a step may write below the computed tokens: into the pages [registered, computed)
  // not considered for caching yet (open pages). The open pages of row s shared with
  // another row (since fork) need a copy before the step writes them: how many (<= s + 1,
  // as pages hold >= 1 token), and copy_open_pages plans each copy. O(open pages).
  std::uint32_t shared_open_pages(Row s, const Request& q, GroupId g) const;
  void copy_open_pages(Row s, Request& q, GroupId g);

 private:
  ManagerCore& m_;
  bool keyed_ = false;
};

}  // namespace kvmm::detail
