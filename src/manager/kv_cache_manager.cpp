// KVCacheManager: the public facade. Each call checks its handle and group arguments and
// forwards to ManagerCore (src/manager/manager_core.hpp), which composes the parts; the
// cost of a call is the core's plus one indirection.
#include "kvmm/manager/kv_cache_manager.hpp"

#include "manager_core.hpp"

namespace kvmm {

KVCacheManager::KVCacheManager(KVLayout layout, const KVCacheManagerOptions& options) try
    : core_(std::make_unique<detail::ManagerCore>(std::move(layout), options)) {
} catch (const std::bad_alloc&) {
  fail(
      "num_large_pages = {}, num_host_large_pages = {}, max_requests = {}: the manager's metadata does not "
      "fit in memory (about 200 bytes per small page and 100 per request row)",
      options.num_large_pages, options.num_host_large_pages, options.max_requests);
}
KVCacheManager::~KVCacheManager() = default;
KVCacheManager::KVCacheManager(KVCacheManager&&) noexcept = default;
KVCacheManager& KVCacheManager::operator=(KVCacheManager&&) noexcept = default;

const KVLayout& KVCacheManager::layout() const { return core_->layout(); }
void KVCacheManager::set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy) {
  core_->set_policy(g, std::move(policy));
}
const LayerPolicy& KVCacheManager::policy(GroupId g) const { return core_->policy(g); }
std::uint64_t KVCacheManager::begin_step() { return core_->begin_step(); }
std::uint64_t KVCacheManager::step() const { return core_->step(); }

RequestId KVCacheManager::add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras) {
  return core_->lifecycle.add_request(tokens, extras);
}
void KVCacheManager::append_tokens(RequestId r, std::span<const std::uint32_t> tokens) {
  core_->lifecycle.append_tokens(r, tokens);
}
std::uint64_t KVCacheManager::lookup_prefix(RequestId r, std::uint64_t limit) {
  return core_->admission.lookup_prefix(r, limit);
}
AllocateResult KVCacheManager::allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  return core_->admission.allocate(r, num_new_tokens, lookahead);
}
std::string_view to_string(AllocateStatus status) {
  switch (status) {
    case AllocateStatus::kOk:
      return "ok";
    case AllocateStatus::kNoMemory:
      return "no_memory";
    case AllocateStatus::kHitLost:
      return "hit_lost";
  }
  return "unknown";
}
void KVCacheManager::commit(RequestId r, std::uint64_t num_computed_tokens) {
  core_->lifecycle.commit(r, num_computed_tokens);
}
void KVCacheManager::check_commit(RequestId r, std::uint64_t num_computed_tokens) const {
  core_->lifecycle.check_commit(r, num_computed_tokens);
}
TokenRange KVCacheManager::draft_recompute(RequestId r, GroupId g) const { return core_->drafts.recompute(r, g); }
bool KVCacheManager::tag_state(RequestId r, GroupId g, std::uint64_t state_tokens) {
  return core_->verified.tag(r, g, state_tokens);
}
RequestId KVCacheManager::fork(RequestId parent) { return core_->lifecycle.fork(parent); }
void KVCacheManager::free(RequestId r) { core_->lifecycle.free(r); }
void KVCacheManager::reset(RequestId r) { core_->lifecycle.reset(r); }
std::optional<std::span<const PageCopy>> KVCacheManager::swap_out(RequestId r) { return core_->swap.swap_out(r); }
std::optional<std::span<const PageCopy>> KVCacheManager::swap_in(RequestId r) { return core_->swap.swap_in(r); }
std::span<const PageCopy> KVCacheManager::copies() const { return core_->copies(); }
void KVCacheManager::reset_prefix_cache() { core_->lifecycle.reset_prefix_cache(); }
PinId KVCacheManager::pin_prefix(RequestId r) { return core_->lifecycle.pin_prefix(r); }
void KVCacheManager::unpin(PinId pin) { core_->lifecycle.unpin(pin); }
void KVCacheManager::set_priority(RequestId r, std::uint32_t priority) { core_->lifecycle.set_priority(r, priority); }
CacheStats KVCacheManager::stats() const { return core_->stats(); }
bool KVCacheManager::cached_image(const MultimodalItem& item, std::uint32_t lora_id) const {
  return core_->images.cached_image(item, lora_id);
}
bool KVCacheManager::image_from_cache(RequestId r, std::uint32_t item) const {
  return core_->images.image_from_cache(r, item);
}
ManagerCounters KVCacheManager::counters() const { return core_->counters(); }
const LookupReport& KVCacheManager::lookup_report(RequestId r) const { return core_->lookup_report(r); }
CacheUsage KVCacheManager::cache_usage(RequestId r) const { return core_->req(r).miss.usage; }
void KVCacheManager::take_events(std::vector<CacheEvent>& out) { core_->take_events(out); }
void KVCacheManager::take_events(KvEventBatch& out) { core_->take_events(out); }

bool KVCacheManager::is_active(RequestId r) const { return core_->requests().is_active(r); }
bool KVCacheManager::is_swapped(RequestId r) const { return core_->req(r).swapped(); }  // raises for a stale handle
std::uint32_t KVCacheManager::num_active() const { return core_->requests().num_active(); }
std::uint64_t KVCacheManager::num_computed(RequestId r) const { return core_->req(r).progress.computed; }
std::uint64_t KVCacheManager::num_allocated(RequestId r) const { return core_->req(r).progress.allocated; }
std::uint64_t KVCacheManager::num_tokens(RequestId r) const { return core_->req(r).ids.num_tokens(); }
std::span<const PageId> KVCacheManager::page_table(RequestId r, GroupId g) const {
  return core_->group(g).table.pages(core_->requests().row(r));
}
const LargePagePool& KVCacheManager::large_pages() const { return core_->large_pages(); }
const SmallPageAllocator& KVCacheManager::small_pages(GroupId g) const { return core_->group(g).alloc; }
PageCounts KVCacheManager::page_counts(GroupId g) const {
  const detail::Group& grp = core_->group(g);
  return {.used = grp.alloc.num_used_small() - grp.evictable, .evictable = grp.evictable, .evicted = grp.evicted};
}
void KVCacheManager::check_invariants() const { core_->check_invariants(); }

}  // namespace kvmm

namespace kvmm {

bool KVCacheManager::would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead) {
  return core_->admission.would_allocate(r, num_new_tokens, lookahead);
}

}  // namespace kvmm
