// HitPins: a lookup's hit adopted into a request's rows (see hit_pins.hpp).
#include "hit_pins.hpp"

namespace kvmm::detail {

bool HitPins::pin_images(Row s, const Request& q, GroupId g, std::uint64_t p) {
  const Group& grp = groups_[g];
  const std::span<const MultimodalItem> items = q.ids.items();
  for (std::uint32_t k = 0; k < items.size(); ++k) {
    if (!grp.image.needs(items[k].offset, items[k].length, p)) continue;
    for (std::uint64_t j = 0; j < q.images.page[g][k + 1] - q.images.page[g][k]; ++j) {
      const PageId page = lookup_.image_page(g, q.ids.item_page_hash(k, j));
      if (page == kNullPage) return false;
      rows_.adopt(g, s, q.images.page[g][k] + j, page);
    }
  }
  return true;
}

bool HitPins::pin(RequestId handle, Row s, const Request& q, std::uint64_t p, std::uint64_t enc_p) {
  if (enc_p == 0) enc_p = p;
  const bool mine = lookup_.claim(handle);
  for (GroupId g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    bool ok = true;
    if (grp.decoder) {
      const std::uint64_t gp = lookup_.group_hit(q, g, p);  // a draft group: its own hit
      const std::uint64_t pages = gp / grp.P;
      const std::uint64_t lo = std::min(grp.policy->first_required_page(gp), pages);
      const PageId* hit = nullptr;
      const BlockHash* check = nullptr;
      ok = lookup_.hit_pages(q, g, gp, mine, &hit, &check) && rows_.adopt_run(g, s, lo, pages, hit, check);
      if (ok) rows_.set_tokens(g, s, gp);
    } else if (!q.ids.items().empty()) {
      rows_.append_null(g, s, q.images.page[g].back());
      rows_.set_tokens(g, s, q.images.page[g].back() * grp.P);
      ok = pin_images(s, q, g, enc_p);
    }
    if (!ok) {  // groups [0, g] give back what they adopted, in place
      for (GroupId h = 0; h <= g; ++h) rows_.unadopt_row(h, s, false);
      return false;
    }
  }
  return true;
}

void HitPins::pin_cached_images(Row s, const Request& q, std::vector<std::uint8_t>& from_cache) {
  const std::span<const MultimodalItem> items = q.ids.items();
  from_cache.assign(items.size(), 0);
  // Each pass over an image's pages: check (all there or cached?), then adopt the missing.
  auto each_missing = [&](std::uint32_t k, auto&& visit) {
    for (GroupId g = 0; g < groups_.size(); ++g) {
      const Group& grp = groups_[g];
      if (grp.decoder || (grp.image.release_when_consumed && k < q.images.consumed)) continue;
      const std::span<const PageId> row = grp.table.pages(s);
      for (std::uint64_t i = q.images.page[g][k]; i < q.images.page[g][k + 1]; ++i)
        if (row[i] == kNullPage && !visit(g, i, q.ids.item_page_hash(k, i - q.images.page[g][k]))) return false;
    }
    return true;
  };
  for (std::uint32_t k = 0; k < items.size(); ++k) {
    const bool cached = each_missing(
        k, [&](GroupId g, std::uint64_t, const BlockHash& h) { return lookup_.image_page(g, h) != kNullPage; });
    if (!cached) continue;
    each_missing(k, [&](GroupId g, std::uint64_t i, const BlockHash& h) {
      rows_.adopt(g, s, i, lookup_.image_page(g, h));
      ++groups_[g].hit_pages;
      return true;
    });
    from_cache[k] = 1;
  }
}

}  // namespace kvmm::detail
