// BlockHasher: the function behind a manager's block hashes (prefix-cache keys, the hashes
// KV events carry, tier keys), chosen by BlockHashOptions: XXH3-128 (the default, the
// values of block_hash.hpp's free functions, ~11 ns per 16-token page), SHA-256 or keyed
// BLAKE2b (libsodium, one call per page: ~0.6 and ~0.4 us; docs/results/block-hash.md).
// Keys stay 128 bits for every choice; what each one guarantees is in docs/manager.md
// ("Block hash functions and tenants") and below.
// Thread-safe (const, no shared state); no heap use after construction.
#pragma once

#include "kvmm/caching/block_hash.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvmm {

enum class BlockHashFunction : std::uint8_t {
  // XXH3-128 (block_hash.hpp's chain). Fastest; not collision-resistant: prompts can be
  // crafted so that two of them (two tenants' salts included) share a key.
  kXxh3_128,
  // SHA-256 of the page's encoding (below), truncated to 128 bits. Keyless and standard; a
  // collision costs ~2^64 SHA-256 evaluations (birthday bound): out of reach of crafted
  // prompts, within reach of a well-funded attacker who may also place text in the other
  // tenant's prompts. Not the choice for tenant isolation against such attackers.
  kSha256,
  // Keyed BLAKE2b with a 128-bit output (BLAKE2b's keyed mode, a PRF) under a
  // per-deployment secret (BlockHashOptions::key, 16-64 bytes): without the key no key can
  // be computed offline, so collisions cannot be searched for; a chance collision among n
  // cached pages has probability ~n^2 / 2^129. The choice for tenant isolation.
  kBlake2bKeyed,
};
std::string_view to_string(BlockHashFunction f);

struct BlockHashOptions {
  BlockHashFunction function = BlockHashFunction::kXxh3_128;
  // false: every page takes `function`. true: only requests with a cache salt do; unsalted
  // requests keep XXH3-128's cost (its chain, with bit 63 of BlockHash::hi cleared in every
  // key, so the values differ from block_hash.hpp's). Salted keys have that bit set: the
  // two live in disjoint key spaces, and no unsalted prompt can produce a salted request's
  // key. Ignored with function = kXxh3_128.
  bool salted_only = false;
  // kBlake2bKeyed: the secret key, 16-64 bytes (32 random bytes recommended), the same on
  // every replica that shares keys (router, tier); anything else is a kvmm::Error naming
  // this option, as is a key given with another function.
  std::string key = {};
};

// The bytes hashed by kSha256 and kBlake2bKeyed (integers in host byte order, little-endian
// on every supported platform); the digest's first 16 bytes are lo (bytes 0-7) and hi:
//   page:      "kvmm.pg1" | parent lo, hi | u32 token count n | u32 flags (1: item, 2: LoRA,
//              4: salt) | n u32 token ids | [item hash lo, hi | u64 item_offset]
//              | [u32 lora_id] | [u64 salt length | salt bytes]
//   item page: "kvmm.it1" | item hash lo, hi | u32 page index | u32 lora_id
//   bytes:     "kvmm.by1" | the bytes
// One call per page (no separate content digest). With salted_only, bit 63 of hi is then
// set (salted requests) or, for XXH3-128, cleared (unsalted ones).
class BlockHasher {
 public:
  BlockHasher() = default;                                // XXH3-128 for every page: block_hash.hpp's values
  explicit BlockHasher(const BlockHashOptions& options);  // kvmm::Error on bad key material
  BlockHasher(const BlockHasher& other) = default;
  BlockHasher& operator=(const BlockHasher& other) = default;
  ~BlockHasher();  // wipes the key

  BlockHashFunction function() const { return function_; }
  bool salted_only() const { return salted_only_; }
  // The function a request's pages take: function() unless salted_only() and !salted.
  BlockHashFunction function_for(bool salted) const {
    return salted_only_ && !salted ? BlockHashFunction::kXxh3_128 : function_;
  }

  // block_hash.hpp's hash_page and hash_pages for a request with (salted) or without a
  // cache salt. O(tokens); no heap use.
  BlockHash hash_page(bool salted, const BlockHash& parent, std::span<const std::uint32_t> tokens,
                      const PageExtraKeys& extra) const;
  void hash_pages(bool salted, const BlockHash& parent, std::span<const std::uint32_t> tokens,
                  std::uint32_t tokens_per_page, std::uint32_t lora_id, std::span<BlockHash> out) const;
  // Pages of an image in an encoder-token group: function() whatever the request's salt
  // (image pages are shared by their item hash, not by the text or salt before them).
  BlockHash hash_item_page(const BlockHash& item, std::uint32_t page_index, std::uint32_t lora_id) const;
  // An item hash (MultimodalItem::hash) of arbitrary bytes with function() (untruncated
  // input; no key-space bit): engines that need collision-resistant image keys use this
  // instead of hash_bytes.
  BlockHash hash_bytes(std::span<const std::byte> bytes) const;

  // Bit 63 of hi: a salted request's key under salted_only().
  static constexpr std::uint64_t kSaltedBit = std::uint64_t{1} << 63;
  // What XXH3-128 keys get: hi &= ~clear, hi |= set (0, 0 unless salted_only()).
  std::uint64_t xxh3_clear_bits() const { return salted_only_ ? kSaltedBit : 0; }

 private:
  BlockHash finish(BlockHashFunction f, BlockHash h) const;

  BlockHashFunction function_ = BlockHashFunction::kXxh3_128;
  bool salted_only_ = false;
  std::uint8_t key_size_ = 0;
  std::array<unsigned char, 64> key_{};
};

}  // namespace kvmm
