// LayerPolicy: one layer kind's prefix-caching rules (Jenga Fig. 9, the slides'
// LayerProperty): which pages a step touches (update_last_access), which pages a running
// request still needs, each page's prefix length (set_prefix_length) and the longest
// valid hit (get_possible_prefix). Every call is O(1) except longest_valid_prefix, which
// costs O(pages it probes): a sliding window probes O(window / page) per candidate.
#pragma once

#include "kvmm/spec/layer_group.hpp"

#include <cstdint>
#include <memory>
#include <string_view>

namespace kvmm {

// Answers "is page `index` of this request's prefix cached?" for one group.
class PageProbe {
 public:
  virtual bool hit(std::uint64_t page_index) = 0;

 protected:
  ~PageProbe() = default;
};

// Rules for a group of decoder tokens. Page i covers tokens [i*P, (i+1)*P), P =
// tokens_per_page (for a Mamba group: the checkpoint interval; page i then holds the state
// after token (i+1)*P - 1). Engines may derive their own and register it with the manager.
class LayerPolicy {
 public:
  explicit LayerPolicy(std::uint32_t tokens_per_page);
  virtual ~LayerPolicy() = default;
  virtual std::string_view name() const = 0;

  std::uint32_t tokens_per_page() const { return tokens_per_page_; }

  // update_last_access: a step that computes tokens [begin, end) reads or writes pages
  // [first_touched_page(begin, end), pages(end)); they get the step's timestamp.
  virtual std::uint64_t first_touched_page(std::uint64_t begin, std::uint64_t end) const = 0;
  // Pages below this index are no longer needed once `computed` tokens have KV: the
  // manager releases them (evictable if cached) and puts the null page in the table.
  virtual std::uint64_t first_needed_page(std::uint64_t computed) const = 0;
  // Pages [first_required_page(p), p / P) must be cached for a hit of p tokens; the hit
  // pins (and touches) exactly these.
  virtual std::uint64_t first_required_page(std::uint64_t prefix) const = 0;
  // get_possible_prefix: the longest valid hit p <= limit (p a multiple of P), given which
  // pages are cached. O(pages probed).
  virtual std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const = 0;
  // A capability: true when a hit of p tokens needs every page below p and nothing else
  // decides it (first_required_page is 0 and longest_valid_prefix is the first missing
  // page), as for full attention. The manager then probes the group once, in page order,
  // up to its first miss, instead of asking longest_valid_prefix (debug builds check that
  // both agree). Default: false.
  virtual bool hit_needs_whole_prefix() const { return false; }
  // set_prefix_length: the LRU tie-break inside one step (longer evicted first). Default:
  // tokens up to the page's end, so pages of one token align across groups.
  virtual std::uint64_t prefix_length(std::uint64_t page_index) const { return (page_index + 1) * tokens_per_page_; }

 protected:
  std::uint64_t floor_page(std::uint64_t tokens) const { return tokens / tokens_per_page_; }
  // The longest page-aligned p <= limit whose pages [first_required_page(p), p / P) all
  // hit, for a first_required_page that never decreases with p (window, chunk): each
  // candidate's pages are checked from the bottom, and a miss at page j moves the
  // candidate to j * P. Each page is probed at most once; where few are cached, one probe
  // per window (O(prefix / window)), where all are, the last window's pages.
  std::uint64_t longest_suffix_hit(std::uint64_t limit, PageProbe& probe) const;
  std::uint32_t tokens_per_page_;
};

// Full attention: touches and needs every page; a hit needs every page of the prefix.
class FullAttentionPolicy final : public LayerPolicy {
 public:
  using LayerPolicy::LayerPolicy;
  std::string_view name() const override { return "full_attention"; }
  bool hit_needs_whole_prefix() const override { return true; }
  std::uint64_t first_touched_page(std::uint64_t, std::uint64_t) const override { return 0; }
  std::uint64_t first_needed_page(std::uint64_t) const override { return 0; }
  std::uint64_t first_required_page(std::uint64_t) const override { return 0; }
  std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const override;
};

// Sliding window w: a query at position q reads [q - w + 1, q]; a hit of p tokens needs
// the last w tokens [p - w, p) cached (Jenga §5.2).
class SlidingWindowPolicy final : public LayerPolicy {
 public:
  SlidingWindowPolicy(std::uint32_t tokens_per_page, std::uint32_t window);
  std::string_view name() const override { return "sliding_window"; }
  std::uint32_t window() const { return window_; }
  std::uint64_t first_touched_page(std::uint64_t begin, std::uint64_t end) const override;
  std::uint64_t first_needed_page(std::uint64_t computed) const override;
  std::uint64_t first_required_page(std::uint64_t prefix) const override;
  std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const override;

 private:
  std::uint32_t window_;
};

// Chunked local attention c: a query reads its own c-aligned chunk only.
class ChunkedLocalPolicy final : public LayerPolicy {
 public:
  ChunkedLocalPolicy(std::uint32_t tokens_per_page, std::uint32_t chunk);
  std::string_view name() const override { return "chunked_local"; }
  std::uint64_t first_touched_page(std::uint64_t begin, std::uint64_t end) const override;
  std::uint64_t first_needed_page(std::uint64_t computed) const override;
  std::uint64_t first_required_page(std::uint64_t prefix) const override;
  std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const override;

 private:
  std::uint64_t chunk_start(std::uint64_t tokens) const { return tokens / chunk_ * chunk_; }
  std::uint32_t chunk_;
};

// Mamba / linear state with checkpoint interval C (= tokens_per_page): hits at multiples
// of C, only the last checkpoint is touched and needed.
class MambaPolicy final : public LayerPolicy {
 public:
  using LayerPolicy::LayerPolicy;
  std::string_view name() const override { return "mamba_state"; }
  std::uint64_t first_touched_page(std::uint64_t begin, std::uint64_t end) const override;
  std::uint64_t first_needed_page(std::uint64_t computed) const override;
  std::uint64_t first_required_page(std::uint64_t prefix) const override;
  std::uint64_t longest_valid_prefix(std::uint64_t limit, PageProbe& probe) const override;
};

// The built-in policy of a decoder group (full, sliding, chunked, Mamba). Raises
// kvmm::Error for an encoder-token group (those use ImagePolicy).
std::unique_ptr<LayerPolicy> make_policy(const LayerGroup& group);

// Rules for encoder-token groups (cross attention, vision embedding; Jenga §5.3, §6.2):
// every page of one image gets the same random prefix length, so the LRU evicts whole
// images; cross-attention pages of an image are needed while the request lives, vision
// embedding pages only until the prefill has consumed the image's tokens.
struct ImagePolicy {
  bool release_when_consumed = false;  // vision embedding
  // A decoder hit of p tokens needs the image's pages iff this returns true.
  static bool cross_needs(std::uint64_t offset, std::uint32_t length, std::uint64_t p) {
    (void)length;
    return offset < p;
  }
  static bool embedding_needs(std::uint64_t offset, std::uint32_t length, std::uint64_t p) {
    return offset < p && p < offset + length;
  }
  bool needs(std::uint64_t offset, std::uint32_t length, std::uint64_t p) const {
    return release_when_consumed ? embedding_needs(offset, length, p) : cross_needs(offset, length, p);
  }
};

}  // namespace kvmm
