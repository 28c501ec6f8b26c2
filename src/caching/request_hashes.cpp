#include "kvmm/caching/request_hashes.hpp"

#include "block_hash_detail.hpp"
#include "kvmm/error.hpp"

#include <algorithm>

namespace kvmm {

void RequestHashes::assign(std::span<const std::uint32_t> tokens, std::uint32_t lora_id, std::string_view salt,
                           std::span<const MultimodalItem> items, std::span<const std::uint32_t> class_tokens,
                           bool hash, bool keep_ids, std::uint64_t reserve_tokens, const BlockHasher& hasher) {
  class_tokens_ = class_tokens;
  hasher_ = &hasher;
  xxh3_ = hasher.function_for(!salt.empty()) == BlockHashFunction::kXxh3_128;
  clear_ = hasher.xxh3_clear_bits();
  const std::uint64_t reserve = std::max<std::uint64_t>(reserve_tokens, tokens.size());
  ids_.clear();
  base_ = 0;
  lora_ = lora_id;
  salt_.assign(salt);
  items_.assign(items.begin(), items.end());
  if (chains_.size() < class_tokens.size()) chains_.resize(class_tokens.size());
  for (std::uint32_t c = 0; c < class_tokens.size(); ++c) {
    chains_[c].clear();
    if (hash) chains_[c].reserve(reserve / class_tokens[c]);
  }
  // Every full page is hashed now, once, straight from the caller's ids; only the ids
  // past the last full page of some class are kept, for the pages they will complete.
  // A 128k-token prompt is read once and not copied (512 KiB less per request).
  std::uint64_t keep_from = keep_ids ? 0 : tokens.size();
  if (hash) {
    const bool plain = bulk() && salt_.empty();
    if (!plain) ids_.assign(tokens.begin(), tokens.end());  // the general path reads ids_
    for (std::uint32_t c = 0; c < class_tokens.size(); ++c) {
      const std::uint64_t pages = tokens.size() / class_tokens[c];
      keep_from = std::min<std::uint64_t>(keep_from, pages * class_tokens[c]);
      if (plain)
        detail::append_page_hashes(chains_[c], tokens, class_tokens[c], lora_, pages, nullptr, clear_);
      else
        hash_general(c, pages);
    }
    ids_.clear();
  }
  ids_.reserve(reserve - keep_from);
  ids_.assign(tokens.begin() + static_cast<std::ptrdiff_t>(keep_from), tokens.end());
  base_ = keep_from;
}

void RequestHashes::append(std::span<const std::uint32_t> tokens) {
  ids_.insert(ids_.end(), tokens.begin(), tokens.end());
}

const BlockHasher& RequestHashes::xxh3_hasher() {
  static const BlockHasher xxh3;
  return xxh3;
}

std::span<const std::uint32_t> RequestHashes::ids(std::uint64_t from, std::uint64_t count) const {
  if (from < base_ || from + count > num_tokens())
    fail("internal: ids [{}, {}) requested, request keeps [{}, {})", from, from + count, base_, num_tokens());
  return std::span<const std::uint32_t>(ids_).subspan(from - base_, count);
}

void RequestHashes::ensure(std::uint32_t cls, std::uint64_t pages) {
  std::vector<BlockHash>& hv = chains_[cls];
  const std::uint32_t P = class_tokens_[cls];
  if (hv.size() >= pages) return;
  if (hv.size() * P < base_)
    fail("internal: request ids before {} dropped, class {} hashed {} pages", base_, cls, hv.size());
  if (bulk() && (!hv.empty() || salt_.empty())) {
    // Plain text pages: one bulk pass.
    const std::size_t from = hv.size();
    detail::append_page_hashes(hv, ids(from * P, (pages - from) * P), P, lora_, pages - from, nullptr, clear_);
    return;
  }
  hash_general(cls, pages);
}

// Page by page with every extra key: the salt on page 0, each overlapping item's hash and
// offset (the first item in the page's own digest, further ones chained after it).
void RequestHashes::hash_general(std::uint32_t cls, std::uint64_t pages) {
  std::vector<BlockHash>& hv = chains_[cls];
  const std::uint32_t P = class_tokens_[cls];
  const std::span<const MultimodalItem> items(items_);
  for (std::uint64_t i = hv.size(); i < pages; ++i) {
    const std::uint64_t start = i * P, end = start + P;
    const BlockHash parent = i > 0 ? hv[i - 1] : BlockHash{};
    PageExtraKeys ex;
    ex.lora_id = lora_;
    if (i == 0) ex.salt = salt_;
    auto it = std::partition_point(items.begin(), items.end(),
                                   [&](const MultimodalItem& m) { return m.offset + m.length <= start; });
    if (it != items.end() && it->offset < end) {
      ex.item = &*it;
      ex.item_offset = start - it->offset;  // wraps when the item starts inside the page
      ++it;
    }
    const bool salted = !salt_.empty();
    BlockHash h = hasher_->hash_page(salted, parent, ids(start, P), ex);
    for (; it != items.end() && it->offset < end; ++it) {
      PageExtraKeys more;
      more.item = &*it;
      more.item_offset = start - it->offset;
      h = hasher_->hash_page(salted, h, {}, more);
    }
    hv.push_back(h);
  }
}

}  // namespace kvmm
