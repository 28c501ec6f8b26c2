// PagedKVAllocator: the two-level allocator of Jenga §4 put together for a whole
// model: one LargePagePool, one SmallPageAllocator and one PageTableSet per layer
// group. append_tokens() grows every decoder group of a request, all groups or none;
// free_request() returns its pages (and whole large pages) at once. A decode step that
// needs no new page costs a few compares per request; a new page is O(1) per group.
// This is the allocation core without prefix caching; KVCacheManager adds caching.
#pragma once

#include "kvmm/paging/large_page_pool.hpp"
#include "kvmm/paging/page_table.hpp"
#include "kvmm/paging/small_page_allocator.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>
#include <vector>

namespace kvmm {

struct PagedKVAllocatorOptions {
  std::uint32_t num_large_pages = 0;  // 0 with a large_page_source: the source's capacity
  std::uint32_t max_requests = 1024;
  Placement placement = Placement::kRequestAware;
  // Where large pages come from when they need real memory behind them (an elastic
  // arena, memory/ArenaPagePool); null: a plain LargePagePool.
  LargePageSource* large_page_source = nullptr;
};

class PagedKVAllocator {
 public:
  // Raises kvmm::Error, before allocating, naming the option at fault: num_large_pages
  // 0 or 2^32-1, a large_page_source of another capacity, max_requests outside
  // [1, 2^32-1), or a group whose small page ids would not fit below 2^32-1.
  PagedKVAllocator(KVLayout layout, const PagedKVAllocatorOptions& options);

  const KVLayout& layout() const { return layout_; }

  // O(1). Raises kvmm::Error when max_requests requests are active.
  RequestId add_request();
  // Adds `num_tokens` decoder tokens to every decoder group (full, sliding, chunked,
  // Mamba). false, with nothing changed, if memory is short.
  bool append_tokens(RequestId r, std::uint32_t num_tokens) {
    check_active(r);
    if (tokens_[r] > ~std::uint64_t{0} - num_tokens) [[unlikely]]
      too_many_tokens(r, num_tokens);
    std::uint32_t* slack = &slack_[std::size_t{r} * layout_.num_groups()];
    bool fits = true;
    for (GroupId g : decoder_groups_) fits &= slack[g] >= num_tokens;
    if (!fits) return grow(r, decoder_groups_, num_tokens, tokens_[r]);
    tokens_[r] += num_tokens;
    for (GroupId g : decoder_groups_) {
      // A state group's slack stays unbounded: its one page covers any length.
      if (slack[g] != kUnboundedSlack) slack[g] -= num_tokens;
      tables_[g].set_num_tokens(Row{r}, tokens_[r]);
    }
    return true;
  }
  // Adds encoder (image) tokens to the cross-attention and vision-embedding groups.
  bool append_encoder_tokens(RequestId r, std::uint32_t num_tokens);
  // Frees every page of the request and ends its large-page associations. O(pages).
  void free_request(RequestId r);
  // Frees one page of r's table in group g (a sliding-window page that left the window)
  // and puts the null page in its entry. O(1). Raises kvmm::Error for an index out of
  // range or an entry that is already the null page.
  void free_page(RequestId r, GroupId g, std::uint32_t index);

  bool is_active(RequestId r) const { return r < active_.size() && active_[r]; }
  std::uint32_t num_active() const { return num_active_; }
  std::uint64_t num_tokens(RequestId r) const {
    check_active(r);
    return tokens_[r];
  }
  std::uint64_t num_encoder_tokens(RequestId r) const {
    check_active(r);
    return encoder_tokens_[r];
  }

  const LargePagePool& large_pages() const { return pool_; }
  const SmallPageAllocator& small_pages(GroupId g) const { return allocators_[group(g)]; }
  // An active request's row in the page tables: this allocator's ids are their rows.
  Row row(RequestId r) const {
    check_active(r);
    return Row{r};
  }
  const PageTableSet& page_tables(GroupId g) const { return tables_[group(g)]; }
  PageTableSet& page_tables(GroupId g) { return tables_[group(g)]; }

  // Recomputes the whole state: every large page free xor held by one group, every
  // small page free xor in exactly one page table, counts add up. O(memory).
  void check_invariants() const;

 private:
  GroupId group(GroupId g) const;
  void check_active(RequestId r) const {
    if (!is_active(r)) bad_request(r);
  }
  [[noreturn, gnu::cold]] void bad_request(RequestId r) const;
  [[noreturn, gnu::cold]] void too_many_tokens(RequestId r, std::uint64_t num_tokens) const;
  // Slack of a state group once it holds its page; a paged group's slack is always below
  // its tokens_per_page, so never this value.
  static constexpr std::uint32_t kUnboundedSlack = ~std::uint32_t{0};
  bool grow(RequestId r, const std::vector<GroupId>& groups, std::uint32_t num_tokens, std::uint64_t& counter);

  KVLayout layout_;
  LargePagePool pool_;
  std::vector<SmallPageAllocator> allocators_;
  std::vector<PageTableSet> tables_;
  std::vector<GroupId> decoder_groups_;
  std::vector<GroupId> encoder_groups_;
  std::vector<std::uint32_t> slack_;  // [request][group]: tokens that fit without a new page
  std::vector<std::uint64_t> tokens_;
  std::vector<std::uint64_t> encoder_tokens_;
  std::vector<std::uint8_t> active_;
  std::vector<RequestId> free_ids_;
  std::vector<std::uint64_t> need_;  // scratch, one per group
  std::uint32_t num_active_ = 0;
};

}  // namespace kvmm
