// KV events: what the manager tells a KV-aware router (and a shared tier) about its prefix
// cache, one batch per take. A stored run is consecutive newly cached full pages of one
// request in one decoder group, with everything a router needs to rebuild its own keys
// (vLLM's BlockStored: block hashes, parent hash, token ids, page size, LoRA id, cache
// salt, multimodal extra keys); a removed run is evicted or dropped hashes; a cleared
// event is reset_prefix_cache(). All variable-length data sits in the batch's flat
// arrays, so a reused batch makes no heap allocation in steady state. O(1) per field read.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvmm {

// The page-level event of one cached or evicted page (take_events(std::vector<CacheEvent>&)):
// what the manager's own tests and simple consumers read.
enum class CacheEventKind : std::uint8_t { kStored, kRemoved };
struct CacheEvent {
  CacheEventKind kind = CacheEventKind::kStored;
  GroupId group = 0;
  PageId page = kNullPage;
  BlockHash hash;
};

// Where the pages of an event live (vLLM's `medium`: "GPU", "CPU", a tier's name).
enum class Medium : std::uint8_t { kDevice, kHost, kRemote };

enum class KvEventKind : std::uint8_t { kStored, kRemoved, kCleared };

// A multimodal item overlapping a stored page: vLLM's extra key (item hash, offset of the
// page's first token relative to the item's first token; negative when the item starts
// inside the page).
struct KvEventItemKey {
  std::uint32_t page_in_run = 0;  // which page of the run
  BlockHash item_hash;
  std::int64_t offset = 0;
};

// One event. Ranges index the owning KvEventBatch's arrays.
struct KvEvent {
  KvEventKind kind = KvEventKind::kStored;
  Medium medium = Medium::kDevice;
  GroupId group = 0;             // kStored, kRemoved
  std::uint32_t hash_begin = 0;  // batch.hashes[hash_begin, hash_begin + num_pages)
  std::uint32_t num_pages = 0;
  // kStored only.
  bool has_parent = false;       // false: the run starts at the request's page 0
  BlockHash parent;              // hash of the page before the run's first
  std::uint64_t first_page = 0;  // index of the run's first page in the request
  std::uint32_t tokens_per_page = 0;
  std::uint64_t token_begin = 0;  // batch.tokens[token_begin, + num_pages * tokens_per_page)
  std::uint32_t lora_id = 0;
  std::uint32_t salt_begin = 0, salt_size = 0;  // batch.text; the salt keys page 0 only
  std::uint32_t item_begin = 0, num_items = 0;  // batch.items
};

struct KvEventBatch {
  std::vector<KvEvent> events;
  std::vector<BlockHash> hashes;
  std::vector<std::uint32_t> tokens;
  std::string text;
  std::vector<KvEventItemKey> items;

  // Keeps capacities: a batch reused across steps makes no heap allocation once grown.
  void clear() {
    events.clear();
    hashes.clear();
    tokens.clear();
    text.clear();
    items.clear();
  }
  bool empty() const { return events.empty(); }
  std::span<const BlockHash> hashes_of(const KvEvent& e) const {
    return std::span<const BlockHash>(hashes).subspan(e.hash_begin, e.num_pages);
  }
  std::span<const std::uint32_t> tokens_of(const KvEvent& e) const {
    return std::span<const std::uint32_t>(tokens).subspan(e.token_begin,
                                                          std::uint64_t{e.num_pages} * e.tokens_per_page);
  }
  std::string_view salt_of(const KvEvent& e) const { return std::string_view(text).substr(e.salt_begin, e.salt_size); }
  std::span<const KvEventItemKey> items_of(const KvEvent& e) const {
    return std::span<const KvEventItemKey>(items).subspan(e.item_begin, e.num_items);
  }
};

}  // namespace kvmm
