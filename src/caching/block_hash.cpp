#include "kvmm/caching/block_hash.hpp"

#include "block_hash_detail.hpp"

#include "kvmm/error.hpp"

#include <cstring>

namespace kvmm {

using detail::content_digest;
using detail::kTagItem;
using detail::link;
using detail::to_hash;

BlockHash hash_page(const BlockHash& parent, std::span<const std::uint32_t> tokens,
                    const PageExtraKeys& extra) {
  return link(parent, content_digest(tokens, extra));
}

void hash_pages(const BlockHash& parent, std::span<const std::uint32_t> tokens,
                std::uint32_t tokens_per_page, std::uint32_t lora_id,
                std::span<BlockHash> out) {
  const std::size_t pages = out.size();
  if (tokens_per_page == 0 || tokens.size() < pages * tokens_per_page)
    fail("tokens: size {} < {} pages x {} tokens", tokens.size(), pages, tokens_per_page);
  PageExtraKeys ex;
  ex.lora_id = lora_id;
  // One pass: page i+1's digest does not depend on the chain, so the core computes it
  // while page i's link (the latency-bound part) is in flight.
  BlockHash h = parent;
  for (std::size_t i = 0; i < pages; ++i)
    out[i] = h = link(h, content_digest(tokens.subspan(i * tokens_per_page, tokens_per_page), ex));
}

BlockHash hash_item_page(const BlockHash& item, std::uint32_t page_index, std::uint32_t lora_id) {
  unsigned char buf[8 + 16 + 4 + 4];
  std::memcpy(buf, &kTagItem, 8);
  std::memcpy(buf + 8, &item, 16);
  std::memcpy(buf + 24, &page_index, 4);
  std::memcpy(buf + 28, &lora_id, 4);
  return to_hash(XXH3_128bits(buf, sizeof buf));
}

BlockHash hash_bytes(std::span<const std::byte> bytes) {
  return to_hash(XXH3_128bits(bytes.data(), bytes.size()));
}

}  // namespace kvmm
