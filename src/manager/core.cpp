// ManagerCore's construction and admission: the options checked before anything is
// allocated, add_request (hashes the prompt, O(tokens)), lookup_prefix (pure, O(pages
// probed)) and allocate (pins the hit, O(hit pages), then Jenga §5.4's steps for the pages
// the step needs, all or nothing).
#include "manager_core.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm::detail {

namespace {

std::uint64_t total_small_pages(const KVLayout& layout, std::uint32_t large_pages) {
  std::uint64_t total = 0;
  for (GroupId g = 0; g < layout.num_groups(); ++g)
    total += std::uint64_t{large_pages} * layout.small_pages_per_large_page(g);
  return total;
}

std::vector<Group> make_groups(const KVLayout& layout, LargePagePool& pool, LargePagePool& host_pool,
                               std::uint32_t max_requests) {
  std::vector<Group> groups;
  groups.reserve(layout.num_groups());  // never reallocated: the LRUs point into each group
  for (GroupId g = 0; g < layout.num_groups(); ++g) groups.emplace_back(layout, g, pool, host_pool, max_requests);
  return groups;
}

// Decoder groups of equal page size share one hash chain (a class); sets each group's.
std::vector<std::uint32_t> hash_classes(std::vector<Group>& groups) {
  std::vector<std::uint32_t> tokens;
  for (Group& grp : groups) {
    if (!grp.decoder) continue;
    auto it = std::find(tokens.begin(), tokens.end(), grp.P);
    grp.hash_class = static_cast<std::uint32_t>(it - tokens.begin());
    if (it == tokens.end()) tokens.push_back(grp.P);
  }
  return tokens;
}

}  // namespace

// The options, checked before any member allocates: every count the constructor sizes an
// array by must fit (page ids are 32-bit; the prefix index holds fewer than 2^31 pages).
KVLayout ManagerCore::validated(KVLayout layout, const KVCacheManagerOptions& options) {
  if (options.num_large_pages == 0) fail("num_large_pages = 0: must be >= 1");
  if (options.large_page_source && options.large_page_source->capacity() != options.num_large_pages)
    fail("large_page_source: holds {} large pages, num_large_pages = {}", options.large_page_source->capacity(),
         options.num_large_pages);
  if (options.learned_boundaries > (1u << 24))
    fail("learned_boundaries = {}: at most {} entries", options.learned_boundaries, 1u << 24);
  if (options.prompt_tail_tokens > (1u << 24))
    fail("prompt_tail_tokens = {}: at most {} tokens", options.prompt_tail_tokens, 1u << 24);
  if (options.max_requests == 0 || options.max_requests > KVCacheManager::kMaxRequests)
    fail("max_requests = {}: must be in [1, {}]", options.max_requests, KVCacheManager::kMaxRequests);
  std::uint64_t per_large = 0;
  for (GroupId g = 0; g < layout.num_groups(); ++g) per_large += layout.small_pages_per_large_page(g);
  const std::uint64_t limit = (std::uint64_t{1} << 31) - 1;
  for (const auto& [name, n] : {std::pair{"num_large_pages", options.num_large_pages},
                                std::pair{"num_host_large_pages", options.num_host_large_pages}}) {
    const std::uint64_t small = std::uint64_t{n} * per_large;  // < 2^32 * 2^32: no overflow
    if (small > limit)
      fail("{} = {}: {} small pages per large page make {} small pages, more than the {} a manager holds", name, n,
           per_large, small, limit);
  }
  return layout;
}

ManagerCore::ManagerCore(KVLayout layout, const KVCacheManagerOptions& options)
    : layout_(validated(std::move(layout), options)),
      options_(options),
      hasher_(options.block_hash),
      pool_(options.num_large_pages, options.large_page_source),
      host_pool_(options.num_host_large_pages),
      groups_(make_groups(layout_, pool_, host_pool_, options.max_requests)),
      class_tokens_(hash_classes(groups_)),
      index_(total_small_pages(layout_, options.num_large_pages),
             static_cast<std::uint32_t>(std::max<std::size_t>(layout_.num_groups(), 1))),
      events_(options.record_events, options.record_kv_events),
      store_(groups_, pool_, index_, events_, options.prefix_caching),
      alloc_(groups_, pool_, store_),
      lookup_(groups_, store_, index_),
      reqs_(options.max_requests, static_cast<std::uint32_t>(layout_.num_groups())),
      rng_(options.seed),
      branches_(options.prefix_caching ? options.learned_boundaries : 0),
      need_(layout_.num_groups(), 0),
      cow_(layout_.num_groups(), 0) {
  copies_.reserve(256);
  pool_.keep_freed(true);  // a source's freed pages stay backed until begin_step (swap plans read them)
  update_anchor();
}

std::uint32_t ManagerCore::running(RequestId r) const {
  const std::uint32_t s = reqs_.row(r);
  if (reqs_[s].swapped) fail("request = {}: swapped out (swap_in first)", r);
  return s;
}

void ManagerCore::set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy) {
  Group& grp = groups_[check_group(g)];
  if (!policy) fail("policy = null: group {} needs a policy", g);
  if (!grp.decoder) fail("group = {}: {} holds encoder tokens; its policy is fixed", g, grp.spec.name);
  if (policy->tokens_per_page() != grp.P)
    fail("policy tokens_per_page = {}: group {} has {}", policy->tokens_per_page(), g, grp.P);
  if (reqs_.num_active() != 0) fail("set_policy: {} requests are active; set policies first", reqs_.num_active());
  grp.whole_prefix = policy->hit_needs_whole_prefix();
  grp.policy = std::move(policy);
  update_anchor();
}

const LayerPolicy& ManagerCore::policy(GroupId g) const {
  const Group& grp = groups_[check_group(g)];
  if (!grp.decoder) fail("group = {}: encoder-token group has an ImagePolicy", g);
  return *grp.policy;
}

// ---------------------------------------------------------------- add_request

namespace {

void check_extras(std::span<const std::uint32_t> tokens, const RequestExtras& extras) {
  constexpr std::uint64_t kMax = KVCacheManager::kMaxTokens;
  if (tokens.size() > kMax) fail("tokens.size() = {}: a request holds at most {} tokens", tokens.size(), kMax);
  if (extras.max_tokens > kMax)
    fail("extras.max_tokens = {}: a request holds at most {} tokens", extras.max_tokens, kMax);
  if (extras.prompt_tokens > kMax)
    fail("extras.prompt_tokens = {}: a request holds at most {} tokens", extras.prompt_tokens, kMax);
  if (extras.prompt_tokens != 0 && extras.prompt_tokens < tokens.size())
    fail("extras.prompt_tokens = {}: fewer than the {} ids given", extras.prompt_tokens, tokens.size());
  const std::uint64_t prompt = std::max<std::uint64_t>(extras.prompt_tokens, tokens.size());
  const std::span<const std::uint64_t> bounds = extras.cache_boundaries;
  if (bounds.size() > kMaxCacheBoundaries)
    fail("extras.cache_boundaries.size() = {}: at most {}", bounds.size(), kMaxCacheBoundaries);
  for (std::size_t k = 0; k < bounds.size(); ++k) {
    if (bounds[k] == 0 || bounds[k] > prompt)
      fail("extras.cache_boundaries[{}] = {}: must be in [1, {}] (the prompt's tokens)", k, bounds[k], prompt);
    if (k > 0 && bounds[k] <= bounds[k - 1])
      fail("extras.cache_boundaries[{}] = {}: must be ascending (previous {})", k, bounds[k], bounds[k - 1]);
  }
  for (std::size_t k = 0; k < extras.items.size(); ++k) {
    const MultimodalItem& m = extras.items[k];
    if (m.length == 0) fail("extras.items[{}].length = 0: must be >= 1", k);
    const std::optional<std::uint64_t> end = try_add<std::uint64_t>(m.offset, m.length);
    if (!end || *end > prompt)
      fail(
          "extras.items[{}]: offset {} + length {} lies past the prompt's {} tokens (cross attention: an item's length "
          "counts encoder tokens; set extras.prompt_tokens to cover them, docs/manager.md 'Images')",
          k, m.offset, m.length, prompt);
    if (k > 0 && m.offset < extras.items[k - 1].offset + extras.items[k - 1].length)
      fail("extras.items[{}].offset = {}: items must be sorted and not overlap", k, m.offset);
  }
}

}  // namespace

RequestId ManagerCore::add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras) {
  if (reqs_.full())
    fail("add_request: all max_requests = {} request rows are active (raise KVCacheManagerOptions::max_requests)",
         reqs_.capacity());
  check_extras(tokens, extras);
  // The row is taken last: whatever throws before (bad_alloc reserving for max_tokens)
  // leaves the manager as it was; an inactive record's fields are rewritten on reuse.
  const std::uint32_t s = reqs_.next_row();
  Request& q = reqs_[s];
  q.ids.assign(tokens, extras.lora_id, extras.cache_salt, extras.items, class_tokens_, options_.prefix_caching,
               events_.runs_on(), extras.max_tokens, hasher_);
  q.swapped = q.looked_up = q.enc_ready = q.enc_registered = q.admitted = q.hit_pending = false;
  q.hit = 0;
  q.item_rank.clear();
  for (std::size_t k = 0; k < extras.items.size(); ++k) q.item_rank.push_back(next_rank());
  q.prio = std::min<std::uint32_t>(extras.priority, SmallLru::kLevels - 1);
  set_boundaries(q, extras.cache_boundaries, std::max<std::uint64_t>(extras.prompt_tokens, tokens.size()));
  q.was_reset = false;
  clear_progress(q);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    q.item_page[g].clear();
    if (groups_[g].decoder) continue;
    std::uint64_t at = 0;
    for (const MultimodalItem& m : extras.items) {
      q.item_page[g].push_back(at);
      at += pages_for(m.length, groups_[g].P);
    }
    q.item_page[g].push_back(at);
  }
  const RequestId r = reqs_.take();
  expensive_check();
  return r;
}

void ManagerCore::loading_error(RequestId r, const char* call) {
  fail("request = {}: {} while it loads from a tier (finish_loads first)", r, call);
}

void ManagerCore::clear_progress(Request& q) {
  q.clear_tier();
  q.computed = q.allocated = q.last_step = q.step_end = q.lookup_tokens = q.branch = 0;
  q.items_consumed = 0;
  q.item_cached.clear();
  std::fill(q.lo.begin(), q.lo.end(), 0);
  std::fill(q.registered.begin(), q.registered.end(), 0);
}

void ManagerCore::append_tokens(RequestId r, std::span<const std::uint32_t> tokens) {
  Request& q = reqs_[reqs_.row(r)];
  if (tokens.size() > KVCacheManager::kMaxTokens - q.ids.num_tokens())
    fail("tokens.size() = {}: request {} has {} tokens, at most {} in all", tokens.size(), r, q.ids.num_tokens(),
         KVCacheManager::kMaxTokens);
  q.ids.append(tokens);
}

void ManagerCore::set_priority(RequestId r, std::uint32_t priority) {
  reqs_[reqs_.row(r)].prio = std::min<std::uint32_t>(priority, SmallLru::kLevels - 1);
}

// ---------------------------------------------------------------- lookup_prefix

std::uint64_t ManagerCore::lookup_prefix(RequestId r) {
  const std::uint32_t s = running(r);
  Request& q = reqs_[s];
  if (q.looked_up || q.allocated > 0 || q.admitted)
    fail("request = {}: lookup_prefix must come once, before the first allocate (or after reset)", r);
  q.looked_up = true;
  ++lookups_;
  const std::uint64_t num_tokens = q.ids.num_tokens();
  lookup_tokens_ += num_tokens;
  q.lookup_tokens = num_tokens;
  if (!options_.prefix_caching || num_tokens <= 1) return 0;
  const std::uint64_t limit = num_tokens - 1;
  // add_request hashed the prompt's full pages; only ids appended since need hashing.
  for (std::uint32_t c = 0; c < class_tokens_.size(); ++c) q.ids.ensure(c, limit / class_tokens_[c]);
  const std::uint64_t p = lookup_.longest_hit(r, q, limit);
  lookup_.count_hit(q, p);
  // The request continues from p; allocate pins the pages the hit needs.
  q.hit = p;
  q.hit_pending = p > 0;
  q.branch = lookup_.whole_prefix_hit(limit);
  const std::span<const MultimodalItem> items = q.ids.items();
  // Embedding pages of images the hit consumed entirely are never needed.
  while (q.items_consumed < items.size() && items[q.items_consumed].offset + items[q.items_consumed].length <= p)
    ++q.items_consumed;
  q.computed = q.allocated = p;
  hit_tokens_ += p;
  return p;
}

// ---------------------------------------------------------------- allocate

void ManagerCore::build_encoder_rows(std::uint32_t s, const Request& q) {
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder || q.ids.items().empty() || grp.table.num_pages(s) != 0) continue;
    for (std::uint64_t i = 0; i < q.item_page[g].back(); ++i) grp.table.append(s, kNullPage);
    grp.table.set_num_tokens(s, q.item_page[g].back() * grp.P);
  }
}

std::uint64_t ManagerCore::encoder_misses(std::uint32_t s, const Request& q, GroupId g) const {
  const Group& grp = groups_[g];
  const bool built = grp.table.num_pages(s) != 0;
  const auto items = static_cast<std::uint32_t>(q.ids.items().size());
  // Cross attention keeps every image, consumed ones included.
  const std::uint32_t first = grp.image.release_when_consumed ? q.items_consumed : 0;
  std::uint64_t misses = 0;
  for (std::uint32_t k = first; k < items; ++k)
    for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i)
      misses += !built || grp.table.pages(s)[i] == kNullPage;
  return misses;
}

// need_[g]: pages of group g the step needs (a copy-on-write copy first where cow_[g]).
// Whether any page is needed.
bool ManagerCore::compute_need(std::uint32_t s, const Request& q, std::uint32_t num_new_tokens, std::uint64_t target) {
  bool any = false;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    need_[g] = 0;
    cow_[g] = 0;
    if (grp.decoder) {
      if (target > q.allocated) {
        // A pending hit will bring its pages (below the policy's first required one: null).
        const std::uint64_t have = q.hit_pending ? q.hit / grp.P : grp.table.num_pages(s);
        const std::uint64_t want = pages_for(target, grp.P);
        need_[g] = want > have ? want - have : 0;
      }
      need_[g] += q.tier_fill[g];  // fresh pages for a tier hit's loads (admit_tier listed them)
      if (num_new_tokens > 0 && q.computed % grp.P != 0) {
        const std::uint64_t idx = q.computed / grp.P;
        const std::span<const PageId> pages = grp.table.pages(s);
        if (idx < pages.size() && pages[idx] != kNullPage && grp.pg[pages[idx]].ref > 1) cow_[g] = 1;
      }
    } else if (!q.enc_ready && !q.ids.items().empty()) {
      need_[g] = encoder_misses(s, q, g);
    }
    need_[g] += cow_[g];
    any |= need_[g] > 0;
  }
  return any;
}

// Takes need_[g] pages of every group (feasible() said they can be had).
void ManagerCore::take_pages(std::uint32_t s, Request& q) {
  auto take = [&](GroupId g) {
    const PageId p = alloc_.take_page(g, s);
    if (p == kNullPage) fail("internal: group {} allocation failed after a successful feasibility check", g);
    return p;
  };
  const std::span<const MultimodalItem> items = q.ids.items();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    if (grp.decoder) {
      if (q.tier_fill[g] > 0) fill_tier_pages(s, q, g);
      if (cow_[g]) {
        const auto idx = static_cast<std::uint32_t>(q.computed / grp.P);
        const PageId old = grp.table.pages(s)[idx];
        const PageId p = take(g);
        store_.init_page(g, p, step_, grp.pg[old].node.key.prefix_len);
        grp.table.set(s, idx, p);
        copies_.push_back(PageCopy{g, old, p});
        ++counts_.cow_copies;
        store_.release(g, old, q.last_step, q.prio);
        --need_[g];
      }
      for (std::uint64_t k = 0; k < need_[g]; ++k) {
        const PageId p = take(g);
        store_.init_page(g, p, step_, grp.policy->prefix_length(grp.table.num_pages(s)));
        grp.table.append(s, p);
      }
      // The table's own token count follows the pages (kernel exports use kv_len instead).
      if (target_ > grp.table.num_tokens(s)) grp.table.set_num_tokens(s, target_);
    } else if (need_[g] > 0) {
      build_encoder_rows(s, q);
      for (std::uint32_t k = 0; k < items.size(); ++k) {
        if (grp.image.release_when_consumed && k < q.items_consumed) continue;
        for (std::uint64_t i = q.item_page[g][k]; i < q.item_page[g][k + 1]; ++i) {
          if (grp.table.pages(s)[i] != kNullPage) continue;
          const PageId p = take(g);
          store_.init_page(g, p, step_, q.item_rank[k]);
          grp.table.set(s, static_cast<std::uint32_t>(i), p);
        }
      }
    }
  }
}

// The lookup's hit into r's rows (references +1). false, nothing changed, when a page of
// it was evicted since the lookup.
bool ManagerCore::admit(RequestId r, std::uint32_t s, Request& q) {
  if (q.tier_pending) return admit_tier(r, s, q);
  if (!lookup_.pin(r, s, q, q.hit)) return false;
  q.hit_pending = false;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t pages = q.hit / grp.P;
    q.lo[g] = std::min(grp.policy->first_required_page(q.hit), pages);
    q.registered[g] = pages;
  }
  return true;
}

// A refused allocate gives back the hit it pinned: every page returns to the list entry
// its lazy pin left (released at time 0 at its own level, so key and level are as the
// lookup found them), and the request is as lookup_prefix left it.
void ManagerCore::release_unpinned_hit(std::uint32_t s, Request& q) {
  release_admission_pins(s, q);
  q.hit_pending = true;
}

// A first allocate with images: each image cached whole comes from the cache, whatever the
// text hit (issue 29: cached_image said "cached" where fresh pages were mapped). Whether
// this is such an allocate. O(pages of the images).
bool ManagerCore::pin_cached_images(std::uint32_t s, Request& q) {
  if (q.enc_ready || q.ids.items().empty()) return false;
  build_encoder_rows(s, q);
  if (options_.prefix_caching) lookup_.pin_cached_images(s, q, q.item_cached);
  return true;
}

// What an allocate that is refused (or only asked: would_allocate) pinned goes back: the
// hit (pinning) or the images it took from the cache.
void ManagerCore::give_back_admission(std::uint32_t s, Request& q, bool pinning, bool images) {
  if (pinning)
    release_unpinned_hit(s, q);
  else if (images)
    release_admission_pins(s, q);
}

// What a refused first allocate pinned (the hit, images from the cache) goes back, the
// rows empty again.
void ManagerCore::release_admission_pins(std::uint32_t s, Request& q) {
  q.item_cached.clear();
  for (GroupId g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    const std::span<const PageId> row = grp.table.pages(s);
    for (std::size_t i = row.size(); i-- > 0;)
      if (row[i] != kNullPage) store_.release(g, row[i], 0, store_.rec(g, row[i]).prio);
    grp.alloc.release_request(s);
    grp.table.clear(s);
    q.lo[g] = q.registered[g] = 0;
  }
}

// The need (compute_need, as if pinned) cannot be had even before the pin: against the
// counts as they are, then, where removing every hit page from the evictable counts would
// refuse too (O(groups)), against the counts less the hit's evictable pages (one read
// pass over the hit, only then: an admission that fits never pays it).
bool ManagerCore::refused_before_pin(RequestId r, const Request& q) {
  if (alloc_.surely_infeasible(need_)) return true;
  leaving_.assign(groups_.size(), 0);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    if (!grp.decoder) continue;
    const std::uint64_t pages = q.hit / grp.P;
    leaving_[g] =
        std::min<std::uint64_t>(pages - std::min(grp.policy->first_required_page(q.hit), pages), grp.evictable);
  }
  if (!alloc_.surely_infeasible(need_, leaving_)) return false;
  return lookup_.evictable_in_hit(r, q, q.hit, leaving_) && alloc_.surely_infeasible(need_, leaving_);
}

// Debug tier 2: the refusal before the pin against the full path (pin, need, replay,
// unpin), which must refuse too. Drops stale list entries only (order unchanged).
void ManagerCore::check_refusal(RequestId r, std::uint32_t s, Request& q, std::uint32_t num_new_tokens,
                                std::uint64_t target) {
  if (!admit(r, s, q)) return;  // allocate's own path answers kHitLost
  const bool fits = !compute_need(s, q, num_new_tokens, target) || alloc_.feasible(s, need_);
  release_unpinned_hit(s, q);
  if (fits) fail("debug check: request {} refused before pinning its hit, but the pinned need fits", r);
}

// A pool over a source backs pages as they are taken, and backing may fail (an elastic
// arena short of chunks): the fresh large pages the step may take (a group's fresh page
// serves it by step 1 until full, after the free small pages of its associated ones) are
// backed first, as many as can be, and the pool then offers only those: the steps and the
// feasibility check count them, evict where they fall short, and cannot fail half way.
// A plain pool: nothing to do.
void ManagerCore::begin_backing(std::uint32_t s) {
  if (!pool_.has_source()) return;
  std::uint64_t fresh = 0;
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const std::uint64_t assoc = groups_[g].alloc.associated_free_small(s);
    if (need_[g] > assoc) fresh += (need_[g] - assoc + groups_[g].n - 1) / groups_[g].n;
  }
  const auto want = static_cast<std::uint32_t>(std::min<std::uint64_t>(fresh, pool_.num_free()));
  if (const std::uint32_t got = pool_.reserve(want); got < want)
    log(LogLevel::kInfo, "{} of {} large pages could be backed", got, want);
}

AllocateResult ManagerCore::refused(RequestId r, const Request& q, std::uint32_t num_new_tokens) {
  ++counts_.refused_allocations;
  if (!q.admitted) ++counts_.refused_admissions;
  log(LogLevel::kDebug, "request {}: allocate of {} tokens refused ({})", r, num_new_tokens,
      q.admitted ? "running" : "admission");
  return {AllocateStatus::kNoMemory};
}

AllocateResult ManagerCore::allocate_at(RequestId r, std::uint32_t s, std::uint32_t num_new_tokens,
                                        std::uint32_t lookahead) {
  Request& q = reqs_[s];
  const std::uint64_t target = q.computed + num_new_tokens + lookahead;  // < 2^32 + 2^33: no wrap
  if (target > KVCacheManager::kMaxTokens)
    fail("num_new_tokens = {}, lookahead = {}: request {} would hold {} tokens, at most {}", num_new_tokens, lookahead,
         r, target, KVCacheManager::kMaxTokens);
  if (q.loading) [[unlikely]]
    loading_error(r, "allocate");
  const bool pinning = q.hit_pending;
  if (pinning) {
    // Refused for sure? Then the hit is not pinned at all. The need counted as if it were
    // (the hit's pages are had) against the evictable counts before the pin takes the hit
    // out of them (more capacity): a refusal here is a refusal after it. Image pages are
    // counted only once the rows exist, so requests with images skip this.
    if (q.ids.items().empty() && !q.tier_pending && compute_need(s, q, num_new_tokens, target) &&
        refused_before_pin(r, q)) {
      if constexpr (kCheckInternal) {
        const bool was = store_.keep_stale(true);
        check_refusal(r, s, q, num_new_tokens, target);
        store_.keep_stale(was);
      }
      return refused(r, q, num_new_tokens);
    }
    if (!admit(r, s, q)) {
      ++counts_.lost_hits;
      log(LogLevel::kWarning, "request {}: its {}-token prefix hit was evicted before its allocate", r, q.hit);
      return {AllocateStatus::kHitLost};  // nothing changed: the engine resets r and looks it up again
    }
  }
  const bool images = pin_cached_images(s, q);
  auto give_back = [&] { give_back_admission(s, q, pinning, images); };
  if (compute_need(s, q, num_new_tokens, target)) {
    try {
      begin_backing(s);
    } catch (...) {  // the source raised: nothing reserved, the hit given back
      give_back();
      throw;
    }
    if (!alloc_.feasible(s, need_)) {
      pool_.end_reservation();
      give_back();
      return refused(r, q, num_new_tokens);
    }
    target_ = target;
    take_pages(s, q);
    pool_.end_reservation();
  }
  if (images) {
    if (q.item_cached.empty()) q.item_cached.assign(q.ids.items().size(), 0);  // prefix caching off
    q.enc_ready = true;
  }
  q.allocated = std::max(q.allocated, target);
  q.step_end = q.computed + num_new_tokens;
  if (!q.admitted) {  // only now do its pages count as accessed
    q.admitted = true;
    q.last_step = step_;
    ++counts_.admissions;
    counts_.admitted_lookup_tokens += q.lookup_tokens;
    counts_.admitted_hit_tokens += q.hit;
    learn_at_admission(q);
  }
  if (q.tier_pending) start_loads(r, s, q);
  expensive_check();
  return {};
}

}  // namespace kvmm::detail
