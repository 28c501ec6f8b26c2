// testing::ManagerInspector: a test's read-only view of a KVCacheManager's pages and
// requests (kvmm/testing/manager_inspector.hpp). Each query is O(1) but held_pages and
// cache_boundaries (O(held pages), O(boundaries)). Lives apart from the manager: the
// testing layer sits above it.
#include "kvmm/testing/manager_inspector.hpp"

#include "../manager/manager_core.hpp"

namespace kvmm {

namespace testing {

PageState ManagerInspector::page_state(GroupId g, PageId p) const {
  const detail::ManagerCore& core = *kv_.core_;
  core.check_page(g, p);
  if (core.store().rec(g, p).ref > 0) return PageState::kUsed;
  return core.store().listed(g, p) ? PageState::kEvictable : PageState::kEmpty;
}

std::uint32_t ManagerInspector::ref_count(GroupId g, PageId p) const {
  return kv_.core_->store().rec(g, kv_.core_->check_page(g, p)).ref;
}

EvictionKey ManagerInspector::eviction_key(GroupId g, PageId p) const {
  return kv_.core_->store().rec(g, kv_.core_->check_page(g, p)).node.key;
}

std::optional<BlockHash> ManagerInspector::page_hash(GroupId g, PageId p) const {
  const detail::PageRec& rec = kv_.core_->store().rec(g, kv_.core_->check_page(g, p));
  if (!rec.hashed) return std::nullopt;
  return rec.hash;
}

PageId ManagerInspector::next_small_victim(GroupId g) const {
  return kv_.core_->store().small_front(kv_.core_->check_group(g));
}
std::vector<std::pair<GroupId, PageId>> ManagerInspector::held_pages(RequestId r) const {
  std::vector<std::pair<GroupId, PageId>> out;
  for (const detail::HeldPage& h : kv_.core_->req(r).keep.held) out.emplace_back(h.group, h.page);
  return out;
}
std::vector<std::uint64_t> ManagerInspector::cache_boundaries(RequestId r) const {
  const auto v = kv_.core_->req(r).keep.bounds.values();
  return {v.begin(), v.end()};
}
std::pair<std::uint64_t, std::uint64_t> ManagerInspector::prompt_tail(RequestId r) const {
  const detail::CacheBoundaries& b = kv_.core_->req(r).keep.bounds;
  return {b.tail_lo(), b.tail_hi()};  // (0, 0) once dropped
}
std::uint32_t ManagerInspector::num_held_pages(RequestId r, GroupId g) const {
  return kv_.core_->req(r).keep.held_in[kv_.core_->check_group(g)];
}
std::vector<std::pair<GroupId, PageId>> ManagerInspector::partial_sources() const {
  const auto src = kv_.core_->partial_sources();
  return {src.begin(), src.end()};
}
std::span<const PageId> ManagerInspector::host_page_table(RequestId r, GroupId g) const {
  const detail::ManagerCore& core = *kv_.core_;
  return core.swap.host(core.check_group(g)).table.pages(core.requests().row(r));
}
LargePageId ManagerInspector::next_large_victim() const { return kv_.core_->store().large_front(); }
LargePageId ManagerInspector::next_mixed_victim() const { return kv_.core_->store().mixed_front(); }

}  // namespace testing

}  // namespace kvmm
