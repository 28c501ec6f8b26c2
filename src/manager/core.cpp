// ManagerCore's construction (the options checked before anything is allocated), its
// handle-to-row resolution, policies, and the queries no unit owns.
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

std::vector<Group> make_groups(const KVLayout& layout, LargePagePool& pool, std::uint32_t max_requests) {
  std::vector<Group> groups;
  groups.reserve(layout.num_groups());  // never reallocated: the LRUs point into each group
  for (GroupId g = 0; g < layout.num_groups(); ++g) groups.emplace_back(layout, g, pool, max_requests);
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

}  // namespace kvmm::detail

namespace kvmm {
// The unset default: packing unless a group is a draft or successor-keyed (see the
// option's comment for the measurement).
bool KVCacheManagerOptions::packs_small_pages(const KVLayout& layout) const {
  if (pack_small_pages) return *pack_small_pages;
  const auto& groups = layout.groups();
  return std::none_of(groups.begin(), groups.end(),
                      [](const LayerGroup& g) { return g.is_draft() || g.successor_tokens > 0; });
}
}  // namespace kvmm

namespace kvmm::detail {

// The options, checked before any member allocates: every count the constructor sizes an
// array by must fit (page ids are 32-bit; the prefix index holds fewer than 2^31 pages).
KVLayout ManagerCore::validated(KVLayout layout, const KVCacheManagerOptions& options) {
  if (options.num_large_pages == 0) fail("num_large_pages = 0: must be >= 1");
  if (options.large_page_source && options.large_page_source->capacity() != options.num_large_pages)
    fail("large_page_source: holds {} large pages, num_large_pages = {}", options.large_page_source->capacity(),
         options.num_large_pages);
  if (options.learned_boundaries > (1u << 24))
    fail("learned_boundaries = {}: at most {} entries", options.learned_boundaries, 1u << 24);
  if (options.miss_reasons > (1u << 24)) fail("miss_reasons = {}: at most {} slots", options.miss_reasons, 1u << 24);
  if (options.learned_tail_tokens > (1u << 24))
    fail("learned_tail_tokens = {}: at most {} tokens", options.learned_tail_tokens, 1u << 24);
  if (options.prompt_tail_tokens > (1u << 24))
    fail("prompt_tail_tokens = {}: at most {} tokens", options.prompt_tail_tokens, 1u << 24);
  if (!(options.retention_budget >= 0.0 && options.retention_budget <= 1.0))
    fail("retention_budget = {}: must be in [0, 1] (a fraction of the device pool's bytes)", options.retention_budget);
  if (options.retention_release > RetentionRelease::kAll)
    fail("retention_release = {}: must be kOff, kOwn or kAll", static_cast<int>(options.retention_release));
  if (options.max_requests == 0 || options.max_requests > KVCacheManager::kMaxRequests)
    fail("max_requests = {}: must be in [1, {}]", options.max_requests, KVCacheManager::kMaxRequests);
  std::uint64_t per_large = 0;
  for (GroupId g = 0; g < layout.num_groups(); ++g) per_large += layout.small_pages_per_large_page(g);
  if (options.hit_unit > 0) {  // hits inside a page: full attention and windows of one page size
    for (GroupId g = 0; g < layout.num_groups(); ++g) {
      const LayerGroup& grp = layout.group(g);
      if (!grp.is_decoder() || grp.is_draft() ||
          (grp.kind != LayerKind::kFullAttention && grp.kind != LayerKind::kSlidingWindow))
        fail("hit_unit = {}: group {} ('{}') is neither full attention nor a sliding window (no partial page)",
             options.hit_unit, g, grp.name);
      if (grp.successor_tokens > 0)  // a page is valid only with the ids after it: never split
        fail("hit_unit = {}: group {} ('{}') is keyed with {} successor tokens (no partial page)", options.hit_unit, g,
             grp.name, grp.successor_tokens);
      if (grp.tokens_per_page % options.hit_unit != 0 || grp.tokens_per_page != layout.group(0).tokens_per_page)
        fail("hit_unit = {}: group {} ('{}') has {}-token pages (every group needs one page size, a multiple of it)",
             options.hit_unit, g, grp.name, grp.tokens_per_page);
    }
  }
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
      groups_(make_groups(layout_, pool_, options.max_requests)),
      class_tokens_(hash_classes(groups_)),
      index_(total_small_pages(layout_, options.num_large_pages),
             static_cast<std::uint32_t>(std::max<std::size_t>(layout_.num_groups(), 1))),
      events_(options.record_events, options.record_kv_events),
      store_(groups_, pool_, index_, events_, options.prefix_caching),
      alloc_(groups_, pool_, store_, options.packs_small_pages(layout_)),
      lookup_(groups_, store_, index_),
      rows_(groups_, store_, alloc_),
      hit_pins_(groups_, lookup_, rows_),
      reqs_(options.max_requests, static_cast<std::uint32_t>(layout_.num_groups())),
      rng_(options.seed),
      branches_(options.prefix_caching ? options.learned_boundaries : 0),
      suffixes_(options.prefix_caching && options.prompt_tail_tokens > 0 ? options.learned_tail_tokens : 0),
      ends_(suffixes_.enabled() ? kLearnedEnds : 0),
      plain_first_(options.prefix_caching ? options.miss_reasons : 0),
      need_(layout_.num_groups(), 0),
      cow_(layout_.num_groups(), 0) {
  copies_.reserve(256);
  // The evicted keys serve the miss reasons and the learned tail (an eviction is no branch).
  if (options.prefix_caching && (options.miss_reasons > 0 || suffixes_.enabled()))
    store_.remember_evictions(std::max(options.miss_reasons, suffixes_.enabled() ? kLearnedEvictions : 0u));
  pool_.keep_freed(true);  // a source's freed pages stay backed until begin_step (swap plans read them)
  retention.update_anchor();
  partial_.configure(groups_, options.prefix_caching ? options.hit_unit : 0);
}

void ManagerCore::drop_partial_sources() {
  for (const auto& [g, p] : partial_holds_) rows_.drop(g, p, step_, store_.rec(g, p).prio);
  partial_holds_.clear();
}

Row ManagerCore::running(RequestId r) const {
  const Row s = reqs_.row(r);
  if (reqs_[s].swapped()) fail("request = {}: swapped out (swap_in first)", r);
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
  grp.policy = grp.draft ? draft_policy(std::move(policy), grp.age_bias > 0) : std::move(policy);
  retention.update_anchor();
}

const LayerPolicy& ManagerCore::policy(GroupId g) const {
  const Group& grp = groups_[check_group(g)];
  if (!grp.decoder) fail("group = {}: encoder-token group has an ImagePolicy", g);
  return *grp.policy;
}

void ManagerCore::loading_error(RequestId r, const char* call) {
  fail("request = {}: {} while it loads from a tier (finish_loads first)", r, call);
}

const LookupReport& ManagerCore::lookup_report(RequestId r) const {
  const Request& q = req(r);
  if (!misses.on()) fail("lookup_report: request {}: KVCacheManagerOptions::miss_reasons is 0 (off)", r);
  if (!q.miss.reported) fail("request = {}: lookup_report before its lookup_prefix (or since its reset)", r);
  return q.miss.report;
}

std::span<const BlockHash> ManagerCore::block_hashes(RequestId r, GroupId g) const {
  const Request& q = req(r);
  const Group& grp = group(g);
  if (!grp.decoder)
    fail("group = {}: {} holds encoder tokens (keyed by image, not by a block hash chain)", g, grp.spec.name);
  return q.ids.chain(grp.hash_class);
}

}  // namespace kvmm::detail
