// RequestHashes: one request's block-hash chains, one per page size ("hash class": decoder
// groups with equal tokens_per_page share a chain), with the token ids and extra keys
// (LoRA id, cache salt, multimodal items) they are computed from. assign() hashes every
// full page of the prompt straight from the caller's ids, O(tokens), and keeps only the
// ids later pages need; ensure() hashes pages completed since, each page once.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/block_hasher.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm {

class RequestHashes {
 public:
  // Starts the request: prompt ids, extras and the page size of each class (the span must
  // outlive this object). With `hash`, every full page of every class is hashed now; ids
  // before the last full page of every class are then dropped unless `keep_ids` (events
  // report the ids of stored pages). Without `hash` no chain is kept and no id either,
  // unless `keep_ids`. `reserve_tokens` sizes the buffers once (0: grow on demand).
  // Capacities are kept from earlier requests: no heap use in steady state. The chains
  // and item pages take `hasher`'s function for this request's salt (the hasher must
  // outlive this object's use; the default: XXH3-128, block_hash.hpp's values).
  void assign(std::span<const std::uint32_t> tokens, std::uint32_t lora_id, std::string_view salt,
              std::span<const MultimodalItem> items, std::span<const std::uint32_t> class_tokens, bool hash,
              bool keep_ids, std::uint64_t reserve_tokens, const BlockHasher& hasher = xxh3_hasher());
  // Ids the engine sampled. O(1) amortized.
  void append(std::span<const std::uint32_t> tokens);
  // Chain `cls` holds at least `pages` hashes afterwards (pages must be full). O(new pages).
  void ensure(std::uint32_t cls, std::uint64_t pages);
  std::span<const BlockHash> chain(std::uint32_t cls) const { return chains_[cls]; }

  std::uint64_t num_tokens() const { return base_ + ids_.size(); }
  // Ids [from, from + count); kvmm::Error when some were dropped (see assign).
  std::span<const std::uint32_t> ids(std::uint64_t from, std::uint64_t count) const;
  std::uint64_t first_kept_id() const { return base_; }
  std::uint32_t lora_id() const { return lora_; }
  std::string_view salt() const { return salt_; }
  std::span<const MultimodalItem> items() const { return items_; }
  // The hash of page `page` of item k in an encoder-token group.
  BlockHash item_page_hash(std::uint32_t k, std::uint64_t page) const {
    return hasher_->hash_item_page(items_[k].hash, static_cast<std::uint32_t>(page), lora_);
  }
  const BlockHasher& hasher() const { return *hasher_; }
  // The default hasher: XXH3-128 for every page.
  static const BlockHasher& xxh3_hasher();

 private:
  void hash_general(std::uint32_t cls, std::uint64_t pages);
  bool bulk() const { return xxh3_ && items_.empty(); }  // the one-pass XXH3 chain serves

  const BlockHasher* hasher_ = &xxh3_hasher();
  bool xxh3_ = true;         // this request's pages take XXH3-128 (the one-pass chain)
  std::uint64_t clear_ = 0;  // bits its XXH3 keys clear (BlockHasher::xxh3_clear_bits)

  std::span<const std::uint32_t> class_tokens_;
  std::vector<std::uint32_t> ids_;  // ids from position base_ on
  std::uint64_t base_ = 0;
  std::uint32_t lora_ = 0;
  std::string salt_;
  std::vector<MultimodalItem> items_;
  std::vector<std::vector<BlockHash>> chains_;
};

}  // namespace kvmm
