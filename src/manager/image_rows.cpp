// ImageRows's calls: see image_rows.hpp.
#include "manager_core.hpp"

#include "kvmm/error.hpp"
#include "prefetch.hpp"

#include <algorithm>

namespace kvmm::detail {

bool ImageRows::cached_image(const MultimodalItem& m, std::uint32_t lora) const {
  if (m.length == 0) fail("item.length = 0: must be >= 1");
  return m_.options_.prefix_caching && m_.lookup_.image_cached(m, lora, m_.hasher_);
}

bool ImageRows::image_from_cache(RequestId r, std::uint32_t item) const {
  const Request& q = m_.req(r);
  if (item >= q.ids.items().size()) fail("item = {}: request {} has {} images", item, r, q.ids.items().size());
  return item < q.images.cached.size() && q.images.cached[item] != 0;
}

void ImageRows::build_encoder_rows(Row s, const Request& q) {
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    if (grp.decoder || q.ids.items().empty() || grp.table.num_pages(s) != 0) continue;
    m_.rows_.append_null(g, s, q.images.page[g].back());
    m_.rows_.set_tokens(g, s, q.images.page[g].back() * grp.P);
  }
}

std::uint64_t ImageRows::encoder_misses(Row s, const Request& q, GroupId g) const {
  const Group& grp = m_.groups_[g];
  const bool built = grp.table.num_pages(s) != 0;
  const auto items = static_cast<std::uint32_t>(q.ids.items().size());
  // Cross attention keeps every image, consumed ones included.
  const std::uint32_t first = grp.image.release_when_consumed ? q.images.consumed : 0;
  std::uint64_t misses = 0;
  for (std::uint32_t k = first; k < items; ++k)
    for (std::uint64_t i = q.images.page[g][k]; i < q.images.page[g][k + 1]; ++i)
      misses += !built || grp.table.pages(s)[i] == kNullPage;
  return misses;
}

// A first allocate with images: each image cached whole comes from the cache, whatever the
// text hit (issue 29: cached_image said "cached" where fresh pages were mapped). Whether
// this is such an allocate. O(pages of the images).
bool ImageRows::pin_cached_images(Row s, Request& q) {
  if (q.images.ready || q.ids.items().empty()) return false;
  build_encoder_rows(s, q);
  if (m_.options_.prefix_caching) m_.hit_pins_.pin_cached_images(s, q, q.images.cached);
  return true;
}

// Encoder groups: image pages are cached at the first commit; vision-embedding pages of
// images the prefill consumed are released (Jenga §6.2).
void ImageRows::commit_images(Row s, Request& q, std::uint64_t c) {
  const std::span<const MultimodalItem> items = q.ids.items();
  for (GroupId g = 0; g < m_.groups_.size(); ++g) {
    Group& grp = m_.groups_[g];
    if (grp.decoder) continue;
    if (m_.options_.prefix_caching && !q.images.registered && c > 0) {
      for (std::uint32_t k = 0; k < items.size(); ++k)
        for (std::uint64_t i = q.images.page[g][k]; i < q.images.page[g][k + 1]; ++i)
          if (const PageId p = grp.table.pages(s)[i]; p != kNullPage)
            m_.store_.register_page(g, p, q.ids.item_page_hash(k, i - q.images.page[g][k]));
    }
    if (!grp.image.release_when_consumed) continue;
    for (std::uint32_t k = q.images.consumed; k < items.size(); ++k) {
      if (items[k].offset + items[k].length > c) break;
      for (std::uint64_t i = q.images.page[g][k + 1]; i-- > q.images.page[g][k];)
        if (grp.table.pages(s)[i] != kNullPage) m_.rows_.release(g, s, i, m_.step_, q.prio);
    }
  }
  if (c > 0) q.images.registered = true;
  while (q.images.consumed < items.size() && items[q.images.consumed].offset + items[q.images.consumed].length <= c)
    ++q.images.consumed;
}

}  // namespace kvmm::detail
