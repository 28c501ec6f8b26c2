// PartialHits: hits that end inside a page (see partial_hits.hpp).
#include "partial_hits.hpp"

#include <algorithm>

namespace kvmm::detail {

void PartialHits::configure(const std::vector<Group>& groups, std::uint32_t unit) {
  unit_ = unit;
  const std::size_t n = unit > 0 ? groups.size() : 0;
  per_page_.assign(n, 0);
  map_.assign(n, {});
  keys_.assign(n, {});
  full_.assign(n, {});
  count_.assign(n, {});
  for (GroupId g = 0; g < n; ++g) {
    if (!groups[g].decoder || groups[g].P <= unit) continue;
    per_page_[g] = groups[g].P / unit - 1;
    keys_[g].resize(groups[g].pg.size() * per_page_[g]);
    full_[g].resize(groups[g].pg.size());
    count_[g].assign(groups[g].pg.size(), 0);
  }
}

BlockHash PartialHits::key(const BlockHash& parent, const RequestHashes& ids, std::uint64_t start, std::uint64_t len) {
  const std::span<const MultimodalItem> items = ids.items();
  const std::uint64_t end = start + len;
  auto it = std::partition_point(items.begin(), items.end(),
                                 [&](const MultimodalItem& m) { return m.offset + m.length <= start; });
  PageExtraKeys ex;
  if (it != items.end() && it->offset < end) {
    ex.item = &*it;
    ex.item_offset = start - it->offset;  // wraps when the item starts inside the tokens
    ++it;
  }
  BlockHash h = hash_page(parent, ids.ids(start, len), ex);
  for (; it != items.end() && it->offset < end; ++it) {
    PageExtraKeys more;
    more.item = &*it;
    more.item_offset = start - it->offset;
    h = hash_page(h, {}, more);
  }
  return h;
}

BlockHash PartialHits::partial_key(const BlockHash& parent, const RequestHashes& ids, std::uint64_t start,
                                   std::uint64_t filled) {
  BlockHash h = key(parent, ids, start, filled);
  h.hi ^= 0x7061727469616c31ULL;  // "partial1": a full page's hash over the same tokens is not this
  return h;
}

void PartialHits::index_page(GroupId g, PageId p, const BlockHash& parent, const BlockHash& full,
                             const RequestHashes& ids, std::uint64_t start, std::uint64_t filled) {
  if (!indexes(g)) return;
  auto& map = map_[g];
  BlockHash* slot = keys_[g].data() + std::size_t{p} * per_page_[g];
  for (std::uint32_t j = 0; j < count_[g][p]; ++j)  // the page's keys of its previous content go
    if (auto it = map.find(slot[j]); it != map.end() && it->second == p) map.erase(it);
  const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(per_page_[g], filled / unit_));
  for (std::uint32_t j = 0; j < n; ++j) {
    slot[j] = key(parent, ids, start, std::uint64_t{j + 1} * unit_);
    map[slot[j]] = p;  // the newest page with these tokens serves
  }
  full_[g][p] = full;
  count_[g][p] = n;
}

PageId PartialHits::find(const std::vector<Group>& groups, GroupId g, const BlockHash& parent, const RequestHashes& ids,
                         std::uint64_t start, std::uint64_t len, BlockHash* full) const {
  if (!indexes(g)) return kNullPage;
  const auto it = map_[g].find(key(parent, ids, start, len));
  if (it == map_[g].end()) return kNullPage;
  const PageId p = it->second;
  const PageRec& rec = groups[g].pg[p];
  if (!rec.hashed || !(rec.hash == full_[g][p])) return kNullPage;  // evicted or re-used since
  *full = rec.hash;
  return p;
}

void PartialHits::clear() {
  for (auto& m : map_) m.clear();
  for (auto& c : count_) std::fill(c.begin(), c.end(), 0);
}

}  // namespace kvmm::detail
