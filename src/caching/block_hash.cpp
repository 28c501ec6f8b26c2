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

namespace {

// The chain over `pages` plain pages of `bytes` bytes each; kBytes > 0 fixes the length at
// compile time (16-token pages), which lets the compiler fold XXH3's length branches.
template <std::size_t kBytes>
[[gnu::always_inline]] inline void chain_plain(BlockHash h, const std::uint32_t* t, std::size_t bytes,
                                               std::size_t pages, BlockHash* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(t);
  const std::size_t stride = kBytes > 0 ? kBytes : bytes;
  for (std::size_t i = 0; i < pages; ++i, p += stride)
    out[i] = h = link(h, to_hash(detail::xxh128(p, stride)));
}

}  // namespace

void hash_pages(const BlockHash& parent, std::span<const std::uint32_t> tokens,
                std::uint32_t tokens_per_page, std::uint32_t lora_id,
                std::span<BlockHash> out) {
  const std::size_t pages = out.size();
  if (tokens_per_page == 0 || tokens.size() < pages * tokens_per_page)
    fail("tokens: size {} < {} pages x {} tokens", tokens.size(), pages, tokens_per_page);
  // One pass: page i+1's digest does not depend on the chain, so the core computes it
  // while page i's link (the latency-bound part) is in flight.
  if (lora_id == 0) {  // a plain page's content digest is XXH3-128 of its ids
    if (tokens_per_page == 16)
      chain_plain<64>(parent, tokens.data(), 64, pages, out.data());
    else
      chain_plain<0>(parent, tokens.data(), std::size_t{tokens_per_page} * 4, pages, out.data());
    return;
  }
  PageExtraKeys ex;
  ex.lora_id = lora_id;
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
