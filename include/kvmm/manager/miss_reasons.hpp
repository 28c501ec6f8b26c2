// Miss reasons (issue 34): why lookup_prefix's hit stopped where it did, per group, and
// per request what it read from and wrote to the cache. The reasons cost nothing unless
// KVCacheManagerOptions::miss_reasons is set; then each lookup classifies its stop
// (O(groups) policy calls over the lookup's memoized probes, one table probe per group),
// each eviction of a keyed page writes one 16-byte table slot, and each request's first
// page costs one extra page hash when it carries a salt, a LoRA id or an image.
// Per-request accounting (cache_usage) is always kept: two counters per request.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kvmm {

// Where a group's hit stopped, from the lookup's own probes.
enum class MissReason : std::uint8_t {
  kNone,              // the hit reached the lookup's limit (prompt - 1 or the caller's cap): nothing missed
  kPageFloor,         // every whole page below the limit hit: the rest is less than one page
  kCheckpointGrid,    // a state group (Mamba): the limit is off its checkpoint grid, the grid floor hit
  kNotCached,         // page k's key (its tokens and all before) was never cached here: the first differing
                      // token is in page k (or it was evicted longer ago than the evicted-key table remembers)
  kKeyMismatch,       // page 0's tokens are cached under other extra keys: a different cache salt or LoRA id
  kImageKey,          // page k holds part of an image: its key carries the image's hash, which no cached page has
  kEvicted,           // page k was cached and evicted (memory pressure), with every group's copy of it
  kRetentionNotHeld,  // a window, chunk or checkpoint page a hit needs was evicted while full attention kept
                      // the prefix: no boundary held it (hint it, or it is learned here)
  kImageEvicted,      // an encoder-token group (cross attention, vision) lacks an image's pages
};
inline constexpr std::size_t kNumMissReasons = 9;
// "none", "page_floor", "checkpoint_grid", "not_cached", "key_mismatch", "image_key", "evicted",
// "retention_not_held", "image_evicted": the Prometheus label values.
std::string_view to_string(MissReason reason);

// One group's part of a lookup: how far it alone would have hit (at most the lookup's
// limit) and why it stopped there.
struct GroupMiss {
  std::uint64_t hit_tokens = 0;  // the group's own longest valid prefix
  MissReason reason = MissReason::kNone;
  std::uint64_t page = 0;  // the page (of this group) where it stopped; its first token: page * tokens_per_page
};

// lookup_report(r): the lookup's answer and each group's part. `reason` is that of the group
// that bounds the hit (the one with the shortest own hit; the first such), kNone when the hit
// reached the limit.
struct LookupReport {
  std::uint64_t limit = 0;  // the longest hit the lookup allowed
  std::uint64_t hit_tokens = 0;
  MissReason reason = MissReason::kNone;
  std::uint32_t group = 0;  // the bounding group (0 when reason is kNone)
  std::vector<GroupMiss> groups;
};

// Per request (Anthropic-style usage): prompt tokens its admissions took from the cache
// (hits pinned by first allocates, a tier's part included, after reset counted again) and
// tokens whose pages it added to the cache (full pages newly cached by its commits, in the
// first full-attention group; the first decoder group without one).
struct CacheUsage {
  std::uint64_t read_tokens = 0;
  std::uint64_t written_tokens = 0;
};

// Per reason: lookups whose hit stopped for it, and the tokens it cost (limit - hit).
struct MissCounters {
  std::array<std::uint64_t, kNumMissReasons> lookups{};
  std::array<std::uint64_t, kNumMissReasons> tokens{};
};

}  // namespace kvmm
