// A draft group's policy (private to src/manager/): its kind's rules (full attention or
// sliding window) with one possible change, the eviction tie-break: with `first` (a draft
// evicted sooner, DraftRole::evict_sooner_steps > 0) a draft page's prefix length is raised
// by kDraftFirst, so among pages of the same age (last access step) the draft's go before
// the target's (the LRU evicts longer prefixes first). Without it a draft page ages as its
// target's page: an EAGLE / MTP draft position costs a target forward to recompute (its
// input is the target's hidden state there), so a draft page is worth its target page's
// tokens at a fraction of its bytes (docs/speculative.md). Every call is the wrapped
// policy's plus one add.
#pragma once

#include "kvmm/caching/layer_policy.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

namespace kvmm::detail {

class DraftPolicy final : public LayerPolicy {
 public:
  static constexpr std::uint64_t kDraftFirst = std::uint64_t{1} << 40;  // past any prefix (< 2^32 tokens)
  DraftPolicy(std::unique_ptr<LayerPolicy> inner, bool first)
      : LayerPolicy(inner->tokens_per_page()), inner_(std::move(inner)), raise_(first ? kDraftFirst : 0) {}
  std::string_view name() const override { return inner_->name(); }
  std::uint64_t first_touched_page(std::uint64_t begin, std::uint64_t end) const override {
    return inner_->first_touched_page(begin, end);
  }
  std::uint64_t first_needed_page(std::uint64_t computed) const override { return inner_->first_needed_page(computed); }
  std::uint64_t first_required_page(std::uint64_t prefix) const override { return inner_->first_required_page(prefix); }
  std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const override {
    return inner_->longest_valid_prefix(limit, probe);
  }
  bool hit_needs_whole_prefix() const override { return inner_->hit_needs_whole_prefix(); }
  std::uint64_t prefix_length(std::uint64_t page_index) const override {
    return inner_->prefix_length(page_index) + raise_;
  }

 private:
  std::unique_ptr<LayerPolicy> inner_;
  std::uint64_t raise_;
};

inline std::unique_ptr<LayerPolicy> draft_policy(std::unique_ptr<LayerPolicy> inner, bool first) {
  return std::make_unique<DraftPolicy>(std::move(inner), first);
}

}  // namespace kvmm::detail
