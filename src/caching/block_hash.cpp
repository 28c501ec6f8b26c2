#include "kvmm/caching/block_hash.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvmm/error.hpp"

#include <cstring>

namespace kvmm {

namespace {
BlockHash to_hash(XXH128_hash_t h) { return BlockHash{h.low64, h.high64}; }

// Tags keep different kinds of keys from colliding by concatenation.
constexpr std::uint64_t kTagItem = 0x6d6d'6974'656d'0001ULL;
constexpr std::uint64_t kTagLora = 0x6c6f'7261'0000'0002ULL;
constexpr std::uint64_t kTagSalt = 0x7361'6c74'0000'0003ULL;
constexpr std::size_t kStackBytes = 2048;
}  // namespace

namespace {
// Digest of a page's own content: its token ids and extra keys (no parent). Pages'
// digests are independent of each other, so a loop over pages overlaps them.
BlockHash content_digest(std::span<const std::uint32_t> tokens, const PageExtraKeys& extra) {
  const std::size_t token_bytes = tokens.size_bytes();
  std::size_t extra_bytes = 0;
  if (extra.item != nullptr) extra_bytes += 8 + 16 + 8;
  if (extra.lora_id != 0) extra_bytes += 8 + 4;
  if (token_bytes + extra_bytes <= kStackBytes && extra.salt.empty()) {
    if (extra_bytes == 0) return to_hash(XXH3_128bits(tokens.data(), token_bytes));
    alignas(8) unsigned char buf[kStackBytes];
    unsigned char* p = buf;
    if (token_bytes != 0) std::memcpy(p, tokens.data(), token_bytes);
    p += token_bytes;
    if (extra.item != nullptr) {
      std::memcpy(p, &kTagItem, 8);
      std::memcpy(p + 8, &extra.item->hash, 16);
      std::memcpy(p + 24, &extra.item_offset, 8);
      p += 32;
    }
    if (extra.lora_id != 0) {
      std::memcpy(p, &kTagLora, 8);
      std::memcpy(p + 8, &extra.lora_id, 4);
      p += 12;
    }
    return to_hash(XXH3_128bits(buf, static_cast<std::size_t>(p - buf)));
  }
  // Long pages (Mamba checkpoint intervals) and salted first pages: streaming state.
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, tokens.data(), token_bytes);
  if (extra.item != nullptr) {
    XXH3_128bits_update(&state, &kTagItem, 8);
    XXH3_128bits_update(&state, &extra.item->hash, 16);
    XXH3_128bits_update(&state, &extra.item_offset, 8);
  }
  if (extra.lora_id != 0) {
    XXH3_128bits_update(&state, &kTagLora, 8);
    XXH3_128bits_update(&state, &extra.lora_id, 4);
  }
  if (!extra.salt.empty()) {
    const std::uint64_t n = extra.salt.size();
    XXH3_128bits_update(&state, &kTagSalt, 8);
    XXH3_128bits_update(&state, &n, 8);
    XXH3_128bits_update(&state, extra.salt.data(), extra.salt.size());
  }
  return to_hash(XXH3_128bits_digest(&state));
}

// The chain link: XXH3-128 over (parent hash, content digest).
BlockHash link(const BlockHash& parent, const BlockHash& content) {
  const std::uint64_t buf[4] = {parent.lo, parent.hi, content.lo, content.hi};
  return to_hash(XXH3_128bits(buf, sizeof buf));
}
}  // namespace

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
  // Pass 1: independent content digests (throughput-bound); pass 2: the chain.
  for (std::size_t i = 0; i < pages; ++i)
    out[i] = content_digest(tokens.subspan(i * tokens_per_page, tokens_per_page), ex);
  BlockHash h = parent;
  for (std::size_t i = 0; i < pages; ++i) out[i] = h = link(h, out[i]);
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
