// Internal (src/ only): the two XXH3-128 steps of a block hash, inline so that callers
// can interleave a chain of links with other work (lookup_prefix probes the prefix index
// for page i while page i+1's link is computed). block_hash.cpp defines the public API.
#pragma once

#include "kvmm/caching/block_hash.hpp"

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include <cstring>
#include <vector>

namespace kvmm::detail {

inline BlockHash to_hash(XXH128_hash_t h) { return BlockHash{h.low64, h.high64}; }

// XXH3_128bits, with its 17..128-byte branch (a 16-token page, a chain link) called
// directly so that the compiler inlines it where the length is known; same values.
[[gnu::always_inline]] inline XXH128_hash_t xxh128(const void* data, std::size_t len) {
  if (len > 16 && len <= 128)
    return XXH3_len_17to128_128b(static_cast<const xxh_u8*>(data), len, XXH3_kSecret, sizeof(XXH3_kSecret), 0);
  return XXH3_128bits(data, len);
}

// Tags keep different kinds of keys from colliding by concatenation.
constexpr std::uint64_t kTagItem = 0x6d6d'6974'656d'0001ULL;
constexpr std::uint64_t kTagLora = 0x6c6f'7261'0000'0002ULL;
constexpr std::uint64_t kTagSalt = 0x7361'6c74'0000'0003ULL;
constexpr std::size_t kStackBytes = 2048;
// Digest of a page's own content: its token ids and extra keys (no parent). Pages'
// digests are independent of each other, so a loop over pages overlaps them.
inline BlockHash content_digest(std::span<const std::uint32_t> tokens, const PageExtraKeys& extra) {
  const std::size_t token_bytes = tokens.size_bytes();
  std::size_t extra_bytes = 0;
  if (extra.item != nullptr) extra_bytes += 8 + 16 + 8;
  if (extra.lora_id != 0) extra_bytes += 8 + 4;
  if (token_bytes + extra_bytes <= kStackBytes && extra.salt.empty()) {
    if (extra_bytes == 0) return to_hash(xxh128(tokens.data(), token_bytes));
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
    return to_hash(xxh128(buf, static_cast<std::size_t>(p - buf)));
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
inline BlockHash link(const BlockHash& parent, const BlockHash& content) {
  const std::uint64_t buf[4] = {parent.lo, parent.hi, content.lo, content.hi};
  return to_hash(xxh128(buf, sizeof buf));
}

// hash_pages for `pages` more pages of a chain whose hashes so far are `hashes`, appended
// to it (no fill of the vector first); their ids are `tokens`' first pages x tokens_per_page,
// also copied to `copy` when not null, so a prompt is read once for both. Every hash's hi
// loses the bits of `clear` (BlockHasher::xxh3_clear_bits(); 0: hash_pages' values).
void append_page_hashes(std::vector<BlockHash>& hashes, std::span<const std::uint32_t> tokens,
                        std::uint32_t tokens_per_page, std::uint32_t lora_id, std::size_t pages, std::uint32_t* copy,
                        std::uint64_t clear = 0);

}  // namespace kvmm::detail
