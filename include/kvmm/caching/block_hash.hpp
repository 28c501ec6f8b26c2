// Block hashes for prefix caching: a page's 128-bit XXH3 hash chains its parent's hash
// with the page's token ids and extra keys (LoRA id, multimodal item hash + offset, a
// cache salt on the first page), so equal hashes mean equal prefixes. One page of 16
// tokens costs two XXH3-128 calls (tens of ns); no heap use. xxHash stays inside src/.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kvmm {

struct BlockHash {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// A multimodal item (an image) whose placeholder tokens are [offset, offset + length)
// of the decoder tokens; `hash` identifies its content (the engine hashes the pixels).
struct MultimodalItem {
  BlockHash hash;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};

// Extra keys of one page: everything besides parent and tokens that changes its KV.
struct PageExtraKeys {
  std::uint32_t lora_id = 0;             // 0: no adapter
  const MultimodalItem* item = nullptr;  // item overlapping the page (the first one), or null
  std::uint64_t item_offset = 0;         // page start relative to the item start (may wrap below)
  std::string_view salt = {};            // only on the first page of a request
};

// The chained hash of one page: XXH3-128 over (parent, XXH3-128 of the page's tokens and
// extra keys). O(tokens); no heap use.
BlockHash hash_page(const BlockHash& parent, std::span<const std::uint32_t> tokens, const PageExtraKeys& extra);
// The same for out.size() consecutive pages with only a LoRA id as extra key (no salt, no
// multimodal item): out[i] == hash_page(out[i-1], page i). One pass; each page's content
// digest overlaps the previous page's chain link. ~9-12 ns per 16-token page.
void hash_pages(const BlockHash& parent, std::span<const std::uint32_t> tokens, std::uint32_t tokens_per_page,
                std::uint32_t lora_id, std::span<BlockHash> out);

// Hash of one page of a multimodal item in an encoder-token group (cross attention,
// vision embedding): depends only on the item, the page index inside it and the LoRA id.
BlockHash hash_item_page(const BlockHash& item, std::uint32_t page_index, std::uint32_t lora_id);

// Convenience for engines: the 128-bit hash of arbitrary bytes (e.g. image pixels).
BlockHash hash_bytes(std::span<const std::byte> bytes);

}  // namespace kvmm
