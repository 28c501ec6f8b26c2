// MissReasons' calls: see miss_reasons.hpp.
#include "manager_core.hpp"

#include <algorithm>

namespace kvmm {

std::string_view to_string(MissReason reason) {
  switch (reason) {
    case MissReason::kNone:
      return "none";
    case MissReason::kPageFloor:
      return "page_floor";
    case MissReason::kCheckpointGrid:
      return "checkpoint_grid";
    case MissReason::kNotCached:
      return "not_cached";
    case MissReason::kKeyMismatch:
      return "key_mismatch";
    case MissReason::kImageKey:
      return "image_key";
    case MissReason::kEvicted:
      return "evicted";
    case MissReason::kRetentionNotHeld:
      return "retention_not_held";
    case MissReason::kImageEvicted:
      return "image_evicted";
  }
  return "unknown";
}

}  // namespace kvmm

namespace kvmm::detail {

bool MissReasons::on() const { return m_.plain_first_.enabled(); }

void MissReasons::on_add(Request& q, std::span<const std::uint32_t> tokens) const {
  q.miss.start();
  if (!on() || m_.anchor_ == kNoGroup) return;
  const std::uint32_t P = m_.groups_[m_.anchor_].P;
  if (tokens.size() < P) return;
  q.miss.plain = m_.hasher_.hash_page(false, BlockHash{}, tokens.first(P), PageExtraKeys{});
  q.miss.has_plain = true;
}

GroupId MissReasons::usage_group() const {
  if (m_.anchor_ != kNoGroup) return m_.anchor_;
  for (GroupId g = 0; g < m_.groups_.size(); ++g)
    if (m_.groups_[g].decoder) return g;
  return kNoGroup;
}

void MissReasons::on_first_page_cached(const Request& q) {
  if (!q.miss.has_plain) return;
  const std::span<const BlockHash> chain = q.ids.chain(m_.groups_[m_.anchor_].hash_class);
  if (!chain.empty()) m_.plain_first_.put(q.miss.plain, chain[0]);
}

// Why decoder group g lacks page k (a hit one page further needs it); anchor_hit: how far
// the first full-attention group alone hit (0 without one).
MissReason MissReasons::classify(const Request& q, GroupId g, std::uint64_t k, std::uint64_t anchor_hit) const {
  const Group& grp = m_.groups_[g];
  // The same tokens sit cached in full attention: this group's page was computed with them
  // and cached, then evicted on its own (a window or checkpoint page released early).
  if (!grp.whole_prefix && anchor_hit >= (k + 1) * grp.P) return MissReason::kRetentionNotHeld;
  const std::span<const BlockHash> keys = page_keys(q, grp, g);  // a successor-keyed group's own
  if (k < keys.size() && m_.store_.was_evicted(g, keys[k])) return MissReason::kEvicted;
  if (m_.anchor_ != kNoGroup && k * grp.P < m_.groups_[m_.anchor_].P && q.miss.has_plain) {
    const std::span<const BlockHash> a = q.ids.chain(m_.groups_[m_.anchor_].hash_class);
    if (const BlockHash* keyed = m_.plain_first_.get(q.miss.plain); keyed && !a.empty() && !(*keyed == a[0]))
      return MissReason::kKeyMismatch;
  }
  for (const MultimodalItem& m : q.ids.items())
    if (m.offset < (k + 1) * grp.P && m.offset + m.length > k * grp.P) return MissReason::kImageKey;
  return MissReason::kNotCached;
}

void MissReasons::explain(Request& q, std::uint64_t limit, std::uint64_t p) {
  LookupReport& rep = q.miss.report;
  q.miss.reported = true;
  rep.limit = limit;
  rep.hit_tokens = p;
  rep.reason = MissReason::kNone;
  rep.group = 0;
  rep.groups.assign(m_.groups_.size(), GroupMiss{});
  if (limit == 0) {  // nothing to look up (a one-token prompt): nothing missed
    ++counts_.lookups[0];
    return;
  }
  PrefixLookup& look = m_.lookup_;
  const std::uint64_t anchor_hit = m_.anchor_ == kNoGroup ? 0 : look.first_miss(m_.anchor_) * m_.groups_[m_.anchor_].P;
  std::uint64_t least = limit;
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    const Group& grp = m_.groups_[g];
    GroupMiss& gm = rep.groups[g];
    if (grp.draft) {
      // A draft group never shortens the hit (speculative.md): its own hit inside it is
      // reported, the engine recomputes the rest (draft_recompute); it names no reason.
      gm.hit_tokens = std::min(q.drafts.hit[g], p);
      gm.page = gm.hit_tokens / grp.P;
      if (gm.hit_tokens < p) gm.reason = MissReason::kNotCached;
      continue;
    }
    gm.hit_tokens = look.own_hit(q, g, limit);
    if (gm.hit_tokens >= limit) continue;
    if (!grp.decoder) {
      gm.reason = MissReason::kImageEvicted;
      const std::span<const MultimodalItem> items = q.ids.items();
      for (std::uint32_t k = 0; k < items.size(); ++k)
        if (items[k].offset == gm.hit_tokens) {
          gm.page = k;  // an encoder-token group: the image's index
          break;
        }
    } else if (gm.hit_tokens == limit / grp.P * grp.P) {
      gm.reason = grp.spec.is_state() ? MissReason::kCheckpointGrid : MissReason::kPageFloor;
      gm.page = gm.hit_tokens / grp.P;
    } else {
      // The hit one page longer: its first required page that is not cached.
      const std::uint64_t c = gm.hit_tokens + grp.P;
      std::uint64_t k = c / grp.P - 1;
      if (grp.whole_prefix) {
        k = look.first_miss(g);
      } else {
        for (std::uint64_t i = std::min(grp.policy->first_required_page(c), k); i < c / grp.P; ++i)
          if (!look.has_page(q, g, i)) {
            k = i;
            break;
          }
      }
      gm.page = k;
      gm.reason = classify(q, g, k, anchor_hit);
    }
    if (gm.hit_tokens < least) {
      least = gm.hit_tokens;
      rep.reason = gm.reason;
      rep.group = g;
    }
  }
  // Groups that each allow a longer hit may still agree only on a shorter one (a window
  // valid at 100 and 50, a chunk at 75 and 50): the shortest own hit's group is named.
  if (p >= limit) {
    rep.reason = MissReason::kNone;
    rep.group = 0;
  }
  const auto r = static_cast<std::size_t>(rep.reason);
  ++counts_.lookups[r];
  counts_.tokens[r] += limit - p;
}

}  // namespace kvmm::detail
