// PartialHits: hits that end inside a page (see partial_hits.hpp).
#include "partial_hits.hpp"

#include <algorithm>

namespace kvmm::detail {

void PartialHits::configure(const std::vector<Group>& groups, std::uint32_t unit) {
  unit_ = unit;
  const std::size_t n = unit > 0 ? groups.size() : 0;
  P_.assign(n, 0);
  head_.assign(n, {});
  next_.assign(n, {});
  prev_.assign(n, {});
  parent_.assign(n, {});
  full_.assign(n, {});
  items_.assign(n, {});
  first_item_.assign(n, {});
  filled_.assign(n, {});
  ids_.assign(n, {});
  for (GroupId g = 0; g < n; ++g) {
    if (!groups[g].decoder || groups[g].P <= unit) continue;
    const std::size_t pages = groups[g].pg.size();
    P_[g] = groups[g].P;
    next_[g].assign(pages, kNullPage);
    prev_[g].assign(pages, kNullPage);
    parent_[g].resize(pages);
    full_[g].resize(pages);
    items_[g].resize(pages);
    first_item_[g].assign(pages, 0);
    filled_[g].assign(pages, 0);
    ids_[g].resize(pages * std::size_t{P_[g]});
  }
}

PartialHits::Items PartialHits::items_in(const RequestHashes& ids, std::uint64_t start, std::uint64_t len) {
  const std::span<const MultimodalItem> items = ids.items();
  Items out{{}, static_cast<std::uint32_t>(len)};
  if (items.empty()) return out;
  const std::uint64_t end = start + len;
  auto it = std::partition_point(items.begin(), items.end(),
                                 [&](const MultimodalItem& m) { return m.offset + m.length <= start; });
  if (it != items.end() && it->offset < end)
    out.first = static_cast<std::uint32_t>(it->offset > start ? it->offset - start : 0);
  for (; it != items.end() && it->offset < end; ++it) {
    PageExtraKeys ex;
    ex.item = &*it;
    ex.item_offset = start - it->offset;  // wraps when the item starts inside the tokens
    out.digest = hash_page(out.digest, {}, ex);
  }
  return out;
}

BlockHash PartialHits::partial_key(const BlockHash& parent, const RequestHashes& ids, std::uint64_t start,
                                   std::uint64_t filled) {
  BlockHash h = hash_page(parent, ids.ids(start, filled), PageExtraKeys{});
  const BlockHash items = items_in(ids, start, filled).digest;
  h.lo ^= items.lo;
  h.hi ^= items.hi ^ 0x7061727469616c31ULL;  // "partial1": a full page's hash over the same tokens is not this
  return h;
}

void PartialHits::unlink(GroupId g, PageId p) {
  std::vector<PageId>& next = next_[g];
  std::vector<PageId>& prev = prev_[g];
  if (prev[p] != kNullPage) {
    next[prev[p]] = next[p];
  } else if (const auto it = head_[g].find(parent_[g][p]); it != head_[g].end()) {
    if (next[p] == kNullPage)
      head_[g].erase(it);
    else
      it->second = next[p];
  }
  if (next[p] != kNullPage) prev[next[p]] = prev[p];
  next[p] = prev[p] = kNullPage;
  filled_[g][p] = 0;
}

void PartialHits::index_page(GroupId g, PageId p, const BlockHash& parent, const BlockHash& full,
                             const RequestHashes& ids, std::uint64_t start, std::uint64_t filled) {
  if (!indexes(g)) return;
  if (filled_[g][p] > 0) unlink(g, p);  // listed for its previous content
  if (filled < unit_) return;
  const std::span<const std::uint32_t> t = ids.ids(start, filled);
  std::copy(t.begin(), t.end(), ids_[g].begin() + static_cast<std::ptrdiff_t>(std::size_t{p} * P_[g]));
  parent_[g][p] = parent;
  full_[g][p] = full;
  const Items items = items_in(ids, start, filled);
  items_[g][p] = items.digest;
  first_item_[g][p] = items.first;
  filled_[g][p] = static_cast<std::uint32_t>(filled);
  const auto [it, fresh] = head_[g].try_emplace(parent, p);
  if (!fresh) {  // the newest page first
    next_[g][p] = it->second;
    prev_[g][it->second] = p;
    it->second = p;
  }
}

std::uint64_t PartialHits::longest(const std::vector<Group>& groups, GroupId g, const BlockHash& parent,
                                   const RequestHashes& ids, std::uint64_t start, std::uint64_t max_len, PageId* page,
                                   BlockHash* full) {
  *page = kNullPage;
  if (!indexes(g) || max_len < unit_) return 0;
  const auto it = head_[g].find(parent);
  if (it == head_[g].end()) return 0;
  const std::span<const std::uint32_t> want = ids.ids(start, max_len);
  const bool items = !ids.items().empty();
  std::uint64_t best = 0;
  for (PageId p = it->second; p != kNullPage;) {
    const PageId next = next_[g][p];
    const PageRec& rec = groups[g].pg[p];
    if (!rec.hashed || !(rec.hash == full_[g][p])) {  // evicted or re-used since
      unlink(g, p);
      p = next;
      continue;
    }
    std::uint64_t m = std::min<std::uint64_t>(max_len, filled_[g][p]);
    if (items || !(items_[g][p] == BlockHash{})) {
      // Tokens alone decide below the first item either side has in the page; past it the
      // items must be the same ones at the same offsets (else the hit stops before them).
      const Items mine = items_in(ids, start, filled_[g][p]);
      if (!(mine.digest == items_[g][p])) m = std::min<std::uint64_t>(m, std::min(mine.first, first_item_[g][p]));
    }
    if (m >= best + unit_) {
      const std::uint32_t* have = ids_[g].data() + std::size_t{p} * P_[g];
      const auto k =
          static_cast<std::uint64_t>(
              std::mismatch(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(m), have).first - want.begin()) /
          unit_ * unit_;
      if (k > best) {
        best = k;
        *page = p;
        *full = rec.hash;
        if (best == max_len) break;
      }
    }
    p = next;
  }
  return best;
}

void PartialHits::clear() {
  for (auto& h : head_) h.clear();
  for (GroupId g = 0; g < filled_.size(); ++g) {
    std::fill(filled_[g].begin(), filled_[g].end(), 0);
    std::fill(next_[g].begin(), next_[g].end(), kNullPage);
    std::fill(prev_[g].begin(), prev_[g].end(), kNullPage);
  }
}

}  // namespace kvmm::detail
