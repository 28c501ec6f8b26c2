#include "kvmm/paging/kv_allocator.hpp"

#include "kvmm/checked.hpp"

namespace kvmm {

namespace {

// Checks the options against the layout before anything is allocated, naming the option
// at fault; returns the number of large pages.
std::uint32_t checked_large_pages(const KVLayout& layout, const PagedKVAllocatorOptions& o) {
  const LargePageSource* src = o.large_page_source;
  const std::uint32_t n = src && o.num_large_pages == 0 ? src->capacity() : o.num_large_pages;
  if (n == 0) fail("num_large_pages = 0: must be >= 1");
  if (n == kNullPage) fail("num_large_pages = {}: must be below 2^32-1 (the null page id)", n);
  if (src && src->capacity() != n)
    fail("num_large_pages = {}: the large_page_source holds {} pages", n, src->capacity());
  if (o.max_requests == 0 || o.max_requests == kNoRequest)
    fail("max_requests = {}: must be in [1, 2^32-1)", o.max_requests);
  for (GroupId g = 0; g < layout.num_groups(); ++g) {
    const std::uint64_t ids = std::uint64_t{n} * layout.small_pages_per_large_page(g);
    if (ids >= kNullPage)
      fail(
          "num_large_pages = {}: group '{}' has {} small pages per large page; {} small page ids "
          "do not fit below 2^32-1",
          n, layout.group(g).name, layout.small_pages_per_large_page(g), ids);
  }
  return n;
}

}  // namespace

PagedKVAllocator::PagedKVAllocator(KVLayout layout, const PagedKVAllocatorOptions& options)
    : layout_(std::move(layout)), pool_(checked_large_pages(layout_, options), options.large_page_source) {
  const auto groups = static_cast<GroupId>(layout_.num_groups());
  allocators_.reserve(groups);
  tables_.reserve(groups);
  for (GroupId g = 0; g < groups; ++g) {
    allocators_.emplace_back(g, layout_.small_pages_per_large_page(g), pool_, options.max_requests, options.placement);
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
  if (!try_add(encoder_tokens_[r], std::uint64_t{num_tokens})) too_many_tokens(r, num_tokens);
  return grow(r, encoder_groups_, num_tokens, encoder_tokens_[r]);
}

void PagedKVAllocator::too_many_tokens(RequestId r, std::uint64_t num_tokens) const {
  fail("num_tokens = {}: request {} would pass 2^64-1 tokens", num_tokens, r);
}

bool PagedKVAllocator::grow(RequestId r, const std::vector<GroupId>& groups, std::uint32_t num_tokens,
                            std::uint64_t& counter) {
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
    } else {         // 64-bit: 2^32-1 tokens must not wrap to 0 pages
      need_[g] = ceil_div(std::uint64_t{num_tokens} - slack[g], grp.tokens_per_page);
    }
    const SmallPageAllocator& a = allocators_[g];
    if (need_[g] > a.num_free_small()) {
      const std::uint64_t n = a.pages_per_large();
      large_needed += (need_[g] - a.num_free_small() + n - 1) / n;
    }
  }
  if (large_needed > pool_.num_free()) return false;
  // Each group leaves in the pool the large pages that the groups after it need.
  // Allocation can still fail when a LargePageSource cannot back a page (an elastic
  // arena out of chunks: allocate answers nothing) or raises (a backend error): either
  // way every page taken here is given back first, so a failed grow changes nothing.
  std::size_t i = 0;  // groups[i] is the group being filled, k its pages taken so far
  std::uint64_t k = 0;
  auto give_back = [&] {
    for (std::uint64_t j = 0; j < k; ++j) allocators_[groups[i]].free(tables_[groups[i]].pop_back(Row{r}));
    for (std::size_t h = 0; h < i; ++h)
      for (std::uint64_t j = 0; j < need_[groups[h]]; ++j)
        allocators_[groups[h]].free(tables_[groups[h]].pop_back(Row{r}));
  };
  std::uint64_t reserve = large_needed;
  try {
    for (; i < groups.size(); ++i) {
      const GroupId g = groups[i];
      SmallPageAllocator& a = allocators_[g];
      if (need_[g] > a.num_free_small()) {
        const std::uint64_t n = a.pages_per_large();
        reserve -= (need_[g] - a.num_free_small() + n - 1) / n;
      }
      for (k = 0; k < need_[g]; ++k) {
        const std::optional<PageId> p = a.allocate(Row{r}, static_cast<std::uint32_t>(reserve));
        if (!p) {
          give_back();
          return false;
        }
        try {
          tables_[g].append(Row{r}, *p);
        } catch (...) {  // the table could not grow: the page is not in it yet
          a.free(*p);
          throw;
        }
      }
      k = 0;
    }
  } catch (...) {
    give_back();
    throw;
  }
  const std::uint64_t after = counter + num_tokens;  // checked by the caller
  for (GroupId g : groups) {
    tables_[g].set_num_tokens(Row{r}, after);
    if (layout_.groups()[g].is_state()) {
      slack[g] = kUnboundedSlack;  // one state page, whatever the length
    } else {                       // < tokens_per_page: fits 32 bits
      slack[g] = static_cast<std::uint32_t>(slack[g] + need_[g] * layout_.groups()[g].tokens_per_page - num_tokens);
    }
  }
  counter = after;
  return true;
}

void PagedKVAllocator::free_request(RequestId r) {
  check_active(r);
  for (GroupId g = 0; g < allocators_.size(); ++g) {
    allocators_[g].release_request(Row{r});
    for (PageId p : tables_[g].pages(Row{r}))
      if (p != kNullPage) allocators_[g].free(p);
    tables_[g].clear(Row{r});
  }
  active_[r] = 0;
  --num_active_;
  free_ids_.push_back(r);
}

void PagedKVAllocator::free_page(RequestId r, GroupId g, std::uint32_t index) {
  check_active(r);
  PageTableSet& t = tables_[group(g)];
  if (index >= t.num_pages(Row{r}))
    fail("index = {}: request {} holds {} pages in group {}", index, r, t.num_pages(Row{r}), g);
  const PageId p = t.pages(Row{r})[index];
  if (p == kNullPage) fail("index = {}: entry of request {} in group {} is already the null page", index, r, g);
  allocators_[g].free(p);
  t.set(Row{r}, index, kNullPage);
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
        if (tables_[g].num_pages(Row{r}) != 0) fail("invariant: inactive request {} holds pages", r);
        continue;
      }
      const LayerGroup& grp = layout_.group(g);
      const std::uint64_t tok = grp.is_decoder() ? tokens_[r] : encoder_tokens_[r];
      if (tables_[g].num_pages(Row{r}) != grp.pages_for_tokens(tok))
        fail("invariant: request {} group {} holds {} pages for {} tokens", r, g, tables_[g].num_pages(Row{r}), tok);
      for (PageId p : tables_[g].pages(Row{r})) {
        if (p == kNullPage) continue;
        if (!a.is_allocated(p)) fail("invariant: request {} group {} maps free page {}", r, g, p);
        if (seen[p]++) fail("invariant: small page {} of group {} in two page tables", p, g);
        ++in_tables;
      }
    }
    if (in_tables != a.num_used_small())
      fail("invariant: group {} has {} used small pages but {} in page tables", g, a.num_used_small(), in_tables);
  }
  if (held + pool_.num_free() != pool_.capacity())
    fail("invariant: {} held + {} free large pages != capacity {}", held, pool_.num_free(), pool_.capacity());
  if (num_active_ + free_ids_.size() != active_.size())
    fail("invariant: {} active + {} free request ids != {}", num_active_, free_ids_.size(), active_.size());
}

}  // namespace kvmm
