#include "kvmm/paging/kv_allocator.hpp"

#include <limits>

namespace kvmm {

namespace {
constexpr std::uint32_t kUnbounded = std::numeric_limits<std::uint32_t>::max();
}

PagedKVAllocator::PagedKVAllocator(KVLayout layout, const PagedKVAllocatorOptions& options)
    : layout_(std::move(layout)), pool_(options.num_large_pages) {
  if (options.num_large_pages == 0) fail("num_large_pages = 0: must be >= 1");
  if (options.max_requests == 0 || options.max_requests == kNoRequest)
    fail("max_requests = {}: must be in [1, 2^32-1)", options.max_requests);
  const auto groups = static_cast<GroupId>(layout_.num_groups());
  allocators_.reserve(groups);
  tables_.reserve(groups);
  for (GroupId g = 0; g < groups; ++g) {
    allocators_.emplace_back(g, layout_.small_pages_per_large_page(g), pool_,
                             options.max_requests, options.placement);
    tables_.emplace_back(options.max_requests, layout_.group(g).tokens_per_page);
    (layout_.group(g).is_decoder() ? decoder_groups_ : encoder_groups_).push_back(g);
  }
  slack_.assign(std::size_t{options.max_requests} * groups, 0);
  tokens_.assign(options.max_requests, 0);
  encoder_tokens_.assign(options.max_requests, 0);
  active_.assign(options.max_requests, 0);
  need_.assign(groups, 0);
  free_ids_.reserve(options.max_requests);
  for (RequestId r = options.max_requests; r-- > 0;) free_ids_.push_back(r);
}

GroupId PagedKVAllocator::group(GroupId g) const {
  if (g >= allocators_.size()) fail("group = {}: layout has {} groups", g, allocators_.size());
  return g;
}

void PagedKVAllocator::bad_request(RequestId r) const {
  if (r >= active_.size()) fail("request = {}: out of range, max_requests is {}", r, active_.size());
  fail("request = {}: not an active request", r);
}

RequestId PagedKVAllocator::add_request() {
  if (free_ids_.empty()) fail("add_request: all max_requests = {} slots are active", active_.size());
  const RequestId r = free_ids_.back();
  free_ids_.pop_back();
  active_[r] = 1;
  ++num_active_;
  tokens_[r] = 0;
  encoder_tokens_[r] = 0;
  for (GroupId g = 0; g < allocators_.size(); ++g) slack_[std::size_t{r} * allocators_.size() + g] = 0;
  return r;
}

bool PagedKVAllocator::append_encoder_tokens(RequestId r, std::uint32_t num_tokens) {
  check_active(r);
  return grow(r, encoder_groups_, num_tokens, encoder_tokens_[r]);
}

bool PagedKVAllocator::grow(RequestId r, const std::vector<GroupId>& groups,
                            std::uint32_t num_tokens, std::uint64_t& counter) {
  std::uint32_t* slack = &slack_[std::size_t{r} * allocators_.size()];
  // Exact feasibility check first, so that failure changes nothing: group g needs
  // ceil((need - free small pages of g) / n_g) fresh large pages.
  std::uint64_t large_needed = 0;
  for (GroupId g : groups) {
    const LayerGroup& grp = layout_.groups()[g];
    if (num_tokens <= slack[g]) {
      need_[g] = 0;
    } else if (grp.is_state()) {
      need_[g] = 1;  // first token: the request's state page
    } else {
      need_[g] = (num_tokens - slack[g] + grp.tokens_per_page - 1) / grp.tokens_per_page;
    }
    const SmallPageAllocator& a = allocators_[g];
    if (need_[g] > a.num_free_small()) {
      const std::uint64_t n = a.pages_per_large();
      large_needed += (need_[g] - a.num_free_small() + n - 1) / n;
    }
  }
  if (large_needed > pool_.num_free()) return false;
  // Each group leaves in the pool the large pages that the groups after it need.
  const std::uint64_t after = counter + num_tokens;
  std::uint64_t reserve = large_needed;
  for (GroupId g : groups) {
    SmallPageAllocator& a = allocators_[g];
    if (need_[g] > a.num_free_small()) {
      const std::uint64_t n = a.pages_per_large();
      reserve -= (need_[g] - a.num_free_small() + n - 1) / n;
    }
    for (std::uint64_t k = 0; k < need_[g]; ++k) {
      const std::optional<PageId> p = a.allocate(r, static_cast<std::uint32_t>(reserve));
      if (!p) fail("internal: group {} allocation failed after a successful capacity check", g);
      tables_[g].append(r, *p);
    }
    tables_[g].set_num_tokens(r, after);
    if (layout_.groups()[g].is_state()) {
      slack[g] = kUnbounded;  // one state page, whatever the length
    } else {
      slack[g] = static_cast<std::uint32_t>(slack[g] + need_[g] * layout_.groups()[g].tokens_per_page - num_tokens);
    }
  }
  counter = after;
  return true;
}

void PagedKVAllocator::free_request(RequestId r) {
  check_active(r);
  for (GroupId g = 0; g < allocators_.size(); ++g) {
    allocators_[g].release_request(r);
    for (PageId p : tables_[g].pages(r))
      if (p != kNullPage) allocators_[g].free(p);
    tables_[g].clear(r);
  }
  active_[r] = 0;
  --num_active_;
  free_ids_.push_back(r);
}

void PagedKVAllocator::free_page(RequestId r, GroupId g, std::uint32_t index) {
  check_active(r);
  PageTableSet& t = tables_[group(g)];
  if (index >= t.num_pages(r))
    fail("index = {}: request {} holds {} pages in group {}", index, r, t.num_pages(r), g);
  const PageId p = t.pages(r)[index];
  if (p == kNullPage) fail("index = {}: entry of request {} in group {} is already the null page", index, r, g);
  allocators_[g].free(p);
  t.set(r, index, kNullPage);
}

void PagedKVAllocator::check_invariants() const {
  std::uint64_t held = 0;
  for (GroupId g = 0; g < allocators_.size(); ++g) {
    const SmallPageAllocator& a = allocators_[g];
    a.check_invariants();
    held += a.num_large_pages();
    std::vector<std::uint8_t> seen(std::size_t{pool_.capacity()} * a.pages_per_large(), 0);
    std::uint64_t in_tables = 0;
    for (RequestId r = 0; r < active_.size(); ++r) {
      if (!active_[r]) {
        if (tables_[g].num_pages(r) != 0) fail("invariant: inactive request {} holds pages", r);
        continue;
      }
      const LayerGroup& grp = layout_.group(g);
      const std::uint64_t tok = grp.is_decoder() ? tokens_[r] : encoder_tokens_[r];
      if (tables_[g].num_pages(r) != grp.pages_for_tokens(tok))
        fail("invariant: request {} group {} holds {} pages for {} tokens", r, g,
             tables_[g].num_pages(r), tok);
      for (PageId p : tables_[g].pages(r)) {
        if (p == kNullPage) continue;
        if (!a.is_allocated(p)) fail("invariant: request {} group {} maps free page {}", r, g, p);
        if (seen[p]++) fail("invariant: small page {} of group {} in two page tables", p, g);
        ++in_tables;
      }
    }
    if (in_tables != a.num_used_small())
      fail("invariant: group {} has {} used small pages but {} in page tables", g,
           a.num_used_small(), in_tables);
  }
  if (held + pool_.num_free() != pool_.capacity())
    fail("invariant: {} held + {} free large pages != capacity {}", held, pool_.num_free(),
         pool_.capacity());
  if (num_active_ + free_ids_.size() != active_.size())
    fail("invariant: {} active + {} free request ids != {}", num_active_, free_ids_.size(),
         active_.size());
}

}  // namespace kvmm
