// PartialHits: hits that end inside a page (see partial_hits.hpp).
#include "partial_hits.hpp"

namespace kvmm::detail {

void PartialHits::configure(const std::vector<Group>& groups, std::uint32_t unit) {
  unit_ = unit;
  const std::size_t n = unit > 0 ? groups.size() : 0;
  per_page_.assign(n, 0);
  map_.assign(n, {});
  keys_.assign(n, {});
  full_.assign(n, {});
  has_.assign(n, {});
  for (GroupId g = 0; g < n; ++g) {
    if (!groups[g].decoder || groups[g].P <= unit) continue;
    per_page_[g] = groups[g].P / unit - 1;
    keys_[g].resize(groups[g].pg.size() * per_page_[g]);
    full_[g].resize(groups[g].pg.size());
    has_[g].assign(groups[g].pg.size(), 0);
  }
}

BlockHash PartialHits::key(const BlockHash& parent, std::span<const std::uint32_t> tokens) {
  return hash_page(parent, tokens, PageExtraKeys{});
}

void PartialHits::index_page(GroupId g, PageId p, const BlockHash& parent, const BlockHash& full,
                             std::span<const std::uint32_t> tokens) {
  if (unit_ == 0 || per_page_[g] == 0) return;
  auto& map = map_[g];
  BlockHash* slot = keys_[g].data() + std::size_t{p} * per_page_[g];
  if (has_[g][p]) {  // the page's keys of its previous content go
    for (std::uint32_t j = 0; j < per_page_[g]; ++j)
      if (auto it = map.find(slot[j]); it != map.end() && it->second == p) map.erase(it);
  }
  for (std::uint32_t j = 0; j < per_page_[g]; ++j) {
    slot[j] = key(parent, tokens.first(std::size_t{j + 1} * unit_));
    map[slot[j]] = p;  // the newest page with these tokens serves
  }
  full_[g][p] = full;
  has_[g][p] = 1;
}

PageId PartialHits::find(const std::vector<Group>& groups, GroupId g, const BlockHash& parent,
                         std::span<const std::uint32_t> tokens, BlockHash* full) const {
  if (unit_ == 0 || per_page_[g] == 0) return kNullPage;
  const auto it = map_[g].find(key(parent, tokens));
  if (it == map_[g].end()) return kNullPage;
  const PageId p = it->second;
  const PageRec& rec = groups[g].pg[p];
  if (!rec.hashed || !(rec.hash == full_[g][p])) return kNullPage;  // evicted or re-used since
  *full = rec.hash;
  return p;
}

void PartialHits::clear() {
  for (auto& m : map_) m.clear();
  for (auto& h : has_) std::fill(h.begin(), h.end(), 0);
}

}  // namespace kvmm::detail
