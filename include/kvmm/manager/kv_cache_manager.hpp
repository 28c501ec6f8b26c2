// KVCacheManager: what a scheduler calls each step. Prefix caching with per-layer-kind
// rules (Jenga §5) on Jenga §4's two-level paging, plus fork / copy-on-write / swap plans
// (PagedAttention §4.4-4.5). Decode step allocate + commit: O(groups); add_request hashes
// the prompt, O(tokens); lookup_prefix: O(pages probed); free: O(pages). Ids and plans
// only, no KV memory is touched. Single-threaded by contract. Guide: docs/manager.md;
// words: docs/glossary.md. The parts behind this facade live in src/manager/.
#pragma once

#include "kvmm/caching/block_hash.hpp"
#include "kvmm/caching/block_hasher.hpp"
#include "kvmm/caching/layer_policy.hpp"
#include "kvmm/manager/kv_events.hpp"
#include "kvmm/manager/miss_reasons.hpp"
#include "kvmm/paging/large_page_pool.hpp"
#include "kvmm/paging/page_table.hpp"
#include "kvmm/paging/small_page_allocator.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace kvmm {

namespace detail {
class ManagerCore;
}
namespace testing {
class ManagerInspector;
}
class TierAdmission;

enum class LogLevel : std::uint8_t { kDebug, kInfo, kWarning };

// KVCacheManagerOptions::retention_release: which pages held for retention a running
// request's refused allocate releases before it refuses.
enum class RetentionRelease : std::uint8_t {
  kOff,  // none: held pages stay until their request ends (kvmm before issue 34)
  kOwn,  // the refused request's own
  kAll,  // any request's
};

struct KVCacheManagerOptions {
  std::uint32_t num_large_pages = 0;       // device pool
  std::uint32_t num_host_large_pages = 0;  // host pool of the same layout, for swap_out
  std::uint32_t max_requests = 1024;       // request rows, at most KVCacheManager::kMaxRequests
  bool prefix_caching = true;
  bool record_events = false;  // keep page events (stored/removed) for take_events(vector<CacheEvent>&)
  // Keep a KV-aware router's events for take_events(KvEventBatch&) (what KvEventPublisher
  // sends as vLLM's stream): stored runs of newly cached decoder pages with their hashes,
  // parent, token ids and extra keys, removed runs, a cleared event per
  // reset_prefix_cache. Costs ~P * 4 + 24 bytes appended per stored page and 16 per
  // removed one, and keeps every request's token ids while it is active (4 B per token).
  bool record_kv_events = false;
  // Called with what the manager decided and why (refused admissions, lost hits, swaps,
  // cache resets); none by default (then each site costs one test). The manager's thread
  // calls it; it must not call back into the manager.
  std::function<void(LogLevel, std::string_view)> log = {};
  std::uint64_t seed = 0x6b766d6d;  // random per-image prefix lengths
  // Where the device pool's large pages come from when they need backing first (e.g.
  // memory/ArenaPagePool over an elastic KVArena, on host or CUDA memory); null: a plain
  // pool. With a source, each allocate first backs the fresh large pages it may take, as
  // many as can be; the rest is made up by eviction, else the allocate returns false with
  // nothing changed. Must outlive the manager and hold num_large_pages pages.
  LargePageSource* large_page_source = nullptr;
  // Learned cache boundaries (boundary-aware retention without hints): when a lookup's
  // full-attention hit is longer than the hit every group allows, the prefix length where
  // they part is remembered (its block hash, in a direct-mapped table of this many
  // entries, 16 bytes each), and a later request whose prompt reaches that prefix holds
  // the pages a hit there needs, as if it had named it in RequestExtras::cache_boundaries.
  // A request's lookups after a reset (preemption) teach nothing: they find its own pages.
  // 0: off. Costs 64 KiB and one table probe per full page a commit registers. On by
  // default: on kvmm-sim's workloads it raised arXiv-QA hits (Ministral 43.6% -> 53.3%,
  // Gemma-2 37.2% -> 41.9%) and changed no other (docs/results/sim.md).
  std::uint32_t learned_boundaries = 4096;
  // Packing (issue 32): a group serves a page from its own large pages (a free small page,
  // then its least recently used cached page if that page's large page holds a page in
  // use) before it takes a whole large page from the pool or by eviction; off: Jenga
  // §5.4's order, which opens a large page per request first. With many small pages per
  // large page beside a group of whole-large-page states (Qwen3-Next: 201 attention pages
  // per state page) Jenga's order left 17-27% of the memory as free attention slots no
  // state could take; packing cut kvmm-sim's steps there 7-17% and changed no other model
  // by more than 1% (docs/results/sim-lineup.md, sim.md). O(1) per page. Unset (the
  // default): on unless the layout has a draft or successor-keyed group, where packing's
  // evictions of cached pages in live large pages raised kvmm-sim's draft recompute from
  // 16-224 to 1,376-20,832 positions (sim-speculative.md's EAGLE/MTP traces); true or
  // false forces it either way.
  std::optional<bool> pack_small_pages = std::nullopt;
  // Prompt-tail boundaries (retention without hints for the usual shape of a shared
  // prefix: a document or a conversation followed by a short question): every request
  // holds the pages that a hit at any length within the last prompt_tail_tokens of its
  // prompt needs in its windowed groups (sliding window, chunked local; not Mamba, whose
  // checkpoint is a whole state), as if it had named each of those lengths in
  // cache_boundaries. A later request sharing all but a short suffix then finds every
  // group's window where it parts, which a learned point can teach only after one such
  // request missed. The guess is kept while it is cheap: once the request has computed
  // prompt_tail_tokens past its prompt (a long answer), the pages only the tail held are
  // released (keyed with that step). Costs at most ~2 x prompt_tail_tokens tokens of
  // window pages per windowed group and running request, released at free/reset with the
  // prefix; O(1) per page leaving a window. 0: off. The default, 64, is the smallest that
  // covers kvmm-sim's arXiv-QA questions (16-64 tokens); it costs long chats 0.9% more
  // steps. Numbers and the sweep it was chosen from in docs/results/sim.md.
  std::uint32_t prompt_tail_tokens = 64;
  // The prompt tail that adapts (issue 34): the manager learns how far followers' prompts
  // run past the prefix they share with an earlier request (prompt length - full-attention
  // hit, at first admissions whose hit ended inside their prompt; the last 256, 5th-95th
  // percentile), and each request's tail then reaches back that far, at most this many
  // tokens: a shared document followed by 400-1,000-token questions is held where the next
  // question parts, not only within prompt_tail_tokens of the end. A follower whose hit
  // ends where a finished request's pages end (a chat turn, a tool call's next step) or
  // whose next page was evicted teaches nothing. The cap on answers stays
  // prompt_tail_tokens. Costs at most this many tokens of window pages per windowed group
  // and running request while its tail is held; a 2 KiB ring, a 64 KiB table of sequence
  // ends, a 2 MiB table of evicted keys (one slot written per eviction), O(1) per admission
  // and free. 0: off (the tail is prompt_tail_tokens). Numbers: docs/results/sim.md.
  std::uint32_t learned_tail_tokens = 2048;
  // The bound on memory held for retention (issue 34): the pages requests hold past their
  // windows for cache boundaries (hinted, learned, prompt tails: window pages and state
  // checkpoints) take at most this fraction of the device pool's bytes, all requests
  // together; a page that would pass it is released as Jenga's rule releases it (O(1) per
  // page). What it costs per request: at most the pages a hit at each of its boundaries
  // needs (one window, or one state checkpoint, per boundary) plus those of the prompt
  // tail (up to learned_tail_tokens of window tokens per windowed group) while it runs; in
  // kvmm-sim every request together held 2-7% of the pool at peak (Gemma-3 agentic 17%),
  // so 0.25 never bound (docs/manager.md's retention section).
  // counters().retention_bytes is what is held now. Must be in [0, 1] (0: nothing held,
  // Jenga's rule), else kvmm::Error.
  double retention_budget = 0.25;
  // Which held pages a running request's refused allocate (or would_allocate) releases
  // before it answers kNoMemory (the engine would preempt): kOwn (default) its own, kAll
  // any request's, oldest hold first, as many as the allocation needs, then it tries again
  // (O(held pages); kAll O(H log H)). Released pages stay cached, evicted before any other.
  // kAll costs arXiv-QA 30% more steps (Gemma-2: 2,276 -> 2,992, hits 71.9% -> 52.0%):
  // the few held pages are the articles' windows, worth more than a preempted request;
  // kOwn costs no row of sim.md's tables more than 0.3% steps (the MTP hybrid's chat at
  // 8 GiB: 1.6 points of hits over 8 seeds, docs/manager.md). counters().retention_released_pages
  // counts them. Else kvmm::Error.
  RetentionRelease retention_release = RetentionRelease::kOwn;
  // The function behind the block hashes (the prefix cache's keys, KV events' hashes, tier
  // keys): XXH3-128 (default, fastest), SHA-256 or keyed BLAKE2b (a per-deployment secret
  // key), for every page or only salted requests' (block_hasher.hpp; what each guarantees:
  // docs/manager.md). Replicas sharing a router or a tier must agree on it. Bad key
  // material: kvmm::Error at construction.
  BlockHashOptions block_hash = {};
  // Miss reasons (kvmm/manager/miss_reasons.hpp): each lookup_prefix says per group where
  // and why its hit stopped (lookup_report), counted per reason in counters().misses and
  // prometheus_text. The value is the number of slots of each of the two key tables that
  // tell an evicted key and a salt/LoRA mismatch from content never seen (32 bytes a slot;
  // older keys are forgotten, then a miss reads as kNotCached). 0: off (the default), then
  // the lookup, eviction and add_request paths each pay one test. Costs when on:
  // docs/results/manager-miss-reasons.md.
  std::uint32_t miss_reasons = 0;
  // Hits finer than a page: a hit may end at any multiple of hit_unit tokens inside a page
  // (vLLM's prefix_match_unit, TensorRT-LLM's partial reuse). The cached page the hit ends
  // in is never written: the admitting allocate copies it into the request's own fresh
  // page (a PageCopy in copies(), run before the step's kernels). Must divide every decoder
  // group's tokens_per_page, and every decoder group must be full attention or a sliding
  // window of one page size (a recurrent state has no partial page; images, draft groups
  // and successor-keyed groups are not split): else kvmm::Error at construction. Keeps each request's token
  // ids and a copy of each cached page's (4 bytes a token), one index entry per cached
  // page under its parent page's hash; a lookup compares the ids of the cached pages
  // after its last full page (one find, then O(P) per page listed there). free() then also caches the request's
  // partial last page (held by it alone, after a full page, a unit or more filled), so
  // the next turn of a conversation hits into it. 0: off (the default), hits end on pages.
  std::uint32_t hit_unit = 0;
  // Sparse state checkpoints: a recurrent-state group (Mamba; not one with tagged
  // checkpoints) keeps in the cache, of the checkpoints a request computes, only those at
  // its prompt's end (the last within prompt - 1 tokens and the last within the prompt)
  // and those a cache boundary (hinted, learned) holds; every other one is evicted as the
  // request passes it instead of cached (kvmm-sim's vllm-0.33 model keeps the same
  // positions, docs/sim.md). Under two-level paging a cached state page in a large page
  // that a running request's state also uses is memory no other group can take: on
  // kvmm-sim's Jamba-1.5-Mini ShareGPT (4 GiB) with 4 states per large page (the layout
  // bound max_state_pages_per_large_page = 0) checkpoints held 12.5% of memory, and this
  // option cut steps 7,257 -> 7,190; at the default bound 2 it costs 7,149 -> 7,203. Off
  // by default: it costs conversations the hits on the previous turn's answer (Jamba chat
  // at 8 GiB 59.3% -> 49.8% of first-admission tokens, Qwen3-Next chat 11 GiB 15.5% -> 12.9%, 0.7%
  // more steps; docs/results/sim.md, "Where kvmm still trails"). O(1) per checkpoint.
  bool sparse_state_checkpoints = false;

  // pack_small_pages resolved for a layout: its value when set, else whether no group of
  // the layout is a draft or successor-keyed. O(groups).
  bool packs_small_pages(const KVLayout& layout) const;
};

struct RequestExtras {
  std::uint32_t lora_id = 0;
  // Sorted by offset, not overlapping, inside the prompt. Cross attention: an item's length
  // counts encoder tokens; prompt_tokens must cover them (docs/manager.md, "Images").
  std::span<const MultimodalItem> items = {};
  // The prompt's full length when its ids arrive in chunks (add_request with the first,
  // append_tokens with the rest); 0: the ids given. Items must end inside it.
  std::uint64_t prompt_tokens = 0;
  std::string_view cache_salt = {};
  std::uint32_t priority = 0;  // retention priority 0..3: pages of higher ones evicted later
  // Expected final length (prompt + output); the request reserves for it once, so
  // steady-state decode steps never touch the heap. 0: grow on demand (amortized doubling).
  std::uint64_t max_tokens = 0;
  // Prefix lengths (tokens) that later requests are likely to share: a system prompt, a
  // document, the previous turns of a conversation. Ascending, each at most the prompt's
  // length; at most kMaxCacheBoundaries. For each boundary L, the pages a hit at L needs in
  // every group (LayerPolicy::first_required_page: a sliding window's last w tokens, a Mamba
  // group's checkpoint) are held while the request runs instead of being released when they
  // leave the window, count as used, and are released at free/reset with the eviction key of
  // the full-attention pages at the same positions, so the cached prefix is evicted as one
  // aligned unit. Costs O(boundaries) per page leaving a window.
  std::span<const std::uint64_t> cache_boundaries = {};
};
inline constexpr std::size_t kMaxCacheBoundaries = 8;

// Copy `src` to `dst` in `group` before the step's kernels run. Copy-on-write copies are
// device -> device; swap plans are device -> host (swap_out) or host -> device.
struct PageCopy {
  GroupId group = 0;
  PageId src = kNullPage;
  PageId dst = kNullPage;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};

enum class PageState : std::uint8_t { kEmpty, kEvictable, kUsed };

struct GroupStats {
  std::uint32_t used_pages = 0;       // small pages with reference count > 0
  std::uint32_t evictable_pages = 0;  // cached, reference count 0
  std::uint32_t empty_pages = 0;      // free small pages inside this group's large pages
  std::uint32_t large_pages = 0;      // large pages the group holds
  std::uint64_t allocated_bytes = 0;  // used_pages * small_page_bytes
  std::uint64_t needed_bytes = 0;     // bytes of tokens actually held by used pages
  std::uint64_t waste_bytes = 0;      // allocated - needed
  std::uint64_t hit_pages = 0;        // pages served from the cache by lookups
  std::uint64_t evicted_pages = 0;
};

struct CacheStats {
  std::vector<GroupStats> groups;
  std::uint32_t free_large_pages = 0;
  std::uint64_t lookups = 0;
  std::uint64_t lookup_tokens = 0;  // prompt tokens looked up
  std::uint64_t hit_tokens = 0;
};

// O(1) counters (counters(): O(groups)), named as metrics.hpp's Prometheus text names them.
// Admission counts separate a request's first successful allocate from the refused
// attempts of a blocked queue head, which a scheduler repeats every step: hit rates over
// admitted requests do not count a prompt once per retry.
struct ManagerCounters {
  std::uint64_t lookups = 0;                   // kvmm_lookups_total: lookup_prefix calls
  std::uint64_t lookup_tokens = 0;             // kvmm_lookup_tokens_total: prompt tokens looked up
  std::uint64_t hit_tokens = 0;                // kvmm_hit_tokens_total: tokens those lookups hit
  std::uint64_t admissions = 0;                // kvmm_admissions_total: first successful allocates
  std::uint64_t admitted_lookup_tokens = 0;    // kvmm_admitted_lookup_tokens_total
  std::uint64_t admitted_hit_tokens = 0;       // kvmm_admitted_hit_tokens_total
  std::uint64_t refused_admissions = 0;        // kvmm_refused_admissions_total: first allocates refused
  std::uint64_t refused_allocations = 0;       // kvmm_refused_allocations_total: every refused allocate
  std::uint64_t lost_hits = 0;                 // kvmm_lost_hits_total: hits evicted before their allocate
  std::uint64_t cow_copies = 0;                // kvmm_cow_copies_total
  std::uint64_t swapped_out_pages = 0;         // kvmm_swapped_out_pages_total
  std::uint64_t swapped_in_pages = 0;          // kvmm_swapped_in_pages_total
  std::uint64_t evicted_pages = 0;             // kvmm_evicted_pages_total (every group)
  std::uint64_t tier_hit_tokens = 0;           // kvmm_tier_hit_tokens_total: tokens extend_prefix added
  std::uint64_t tier_loaded_pages = 0;         // kvmm_tier_loaded_pages_total: loads finished kOk
  std::uint64_t tier_failed_pages = 0;         // kvmm_tier_failed_pages_total: loads finished otherwise
  std::uint64_t tier_cut_tokens = 0;           // kvmm_tier_cut_tokens_total: hit tokens a failed load cut
  std::uint64_t retention_released_pages = 0;  // kvmm_retention_released_pages_total: by pressure
  std::uint64_t retention_bytes = 0;           // kvmm_retention_bytes (gauge): held for retention now
  std::uint32_t active_requests = 0;           // kvmm_active_requests (gauge)
  std::uint32_t free_large_pages = 0;          // kvmm_free_large_pages (gauge)
  std::uint32_t large_pages = 0;               // kvmm_large_pages (gauge)
  std::vector<std::uint32_t> used_pages;       // kvmm_used_pages{group="name"} (gauge)
  std::vector<std::uint32_t> evictable_pages;  // kvmm_evictable_pages{group="name"} (gauge)
  // With KVCacheManagerOptions::miss_reasons, per MissReason: kvmm_lookup_stops_total{reason}
  // (lookups whose hit stopped for it) and kvmm_missed_tokens_total{reason} (limit - hit).
  MissCounters misses;
};

using PinId = std::uint32_t;

// Tokens [begin, end) of a request.
struct TokenRange {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  friend bool operator==(const TokenRange&, const TokenRange&) = default;
};

// What allocate did. kOk: the pages are there. kNoMemory: refused, nothing changed (free,
// preempt or wait) but, for a running request, pages held for retention released first
// (still cached, no page table changed: KVCacheManagerOptions::retention_release).
// kHitLost: the first allocate found pages of its lookup's hit evicted by other requests'
// allocations since lookup_prefix; nothing changed, and the engine resets the request
// and looks it up again (a normal path, counted as lost_hits).
enum class AllocateStatus : std::uint8_t { kOk, kNoMemory, kHitLost };
std::string_view to_string(AllocateStatus status);  // "ok", "no_memory", "hit_lost"

// allocate's result: `if (!kv.allocate(r, n))` tests for kOk; `kind` says why not.
struct AllocateResult {
  AllocateStatus kind = AllocateStatus::kOk;
  constexpr explicit operator bool() const { return kind == AllocateStatus::kOk; }
  friend constexpr bool operator==(AllocateResult, AllocateResult) = default;
};

// How the kernel-facing exports write a batch's rows (see PageTableSet's ExportOptions).
// A group's pages right now (KVCacheManager::page_counts).
struct PageCounts {
  std::uint32_t used = 0;       // distinct small pages held by requests or pins (reference count > 0)
  std::uint32_t evictable = 0;  // cached, held by none: the evictor's
  std::uint64_t evicted = 0;    // pages evicted so far
};

struct KernelExportOptions {
  // Written for every kNullPage entry (out-of-window pages, images not needed) and as the
  // dense padding: a zero-filled page the engine reserves, so FlashInfer and FlashAttention
  // never read kNullPage as a page id. kNullPage: left as is (kvmm's own kernels skip it).
  PageId null_page = kNullPage;
  // CSR only: rows start at their first page that is not null; first_page[i] receives its
  // index in the row (a kernel adds first_page[i] * tokens_per_page to positions).
  bool trim = false;
};

// One group's block table in the calls that export several groups at once: FlashAttention's
// int32 [batch, max_pages] table (row-major), holding the previous incremental export of
// `group` into it.
struct BlockTableOut {
  GroupId group = 0;
  std::span<std::int32_t> table;
};

class KVCacheManager {
 public:
  static constexpr std::uint64_t kMaxTokens = (std::uint64_t{1} << 32) - 1;  // per request
  static constexpr std::uint32_t kMaxRequests = std::uint32_t{1} << 24;      // max_requests
  // Raises kvmm::Error naming the option at fault before allocating anything.
  KVCacheManager(KVLayout layout, const KVCacheManagerOptions& options);
  ~KVCacheManager();
  KVCacheManager(const KVCacheManager&) = delete;
  KVCacheManager& operator=(const KVCacheManager&) = delete;
  KVCacheManager(KVCacheManager&&) noexcept;
  KVCacheManager& operator=(KVCacheManager&&) noexcept;

  const KVLayout& layout() const;
  // Replaces a decoder group's policy (before the first request). Raises kvmm::Error for a
  // group out of range, an encoder-token group, or a tokens_per_page mismatch.
  void set_policy(GroupId g, std::unique_ptr<LayerPolicy> policy);
  const LayerPolicy& policy(GroupId g) const;

  // Starts a scheduler step: the timestamp of everything touched until the next call;
  // clears copies(). O(1).
  std::uint64_t begin_step();
  std::uint64_t step() const;

  // Registers a request with its prompt token ids and returns its handle. With prefix
  // caching on it hashes every full page, O(tokens), and keeps only the ids past the last
  // full page (later pages need them). A handle names one request: once it is freed, the
  // handle is stale and every call with it raises kvmm::Error.
  RequestId add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras = {});
  // Token ids the engine sampled; commit() hashes full pages, so it needs them first.
  void append_tokens(RequestId r, std::span<const std::uint32_t> tokens);
  void append_token(RequestId r, std::uint32_t token) { append_tokens(r, {&token, 1}); }
  // The longest prefix valid in every group (at most prompt - 1 tokens): the request
  // continues from there. Pure: no page changes hands until allocate(r) pins the hit (a
  // refused admission therefore changes nothing). Once, before the first allocate (and
  // again after reset). If pages of the hit are evicted before that allocate (by other
  // requests' allocations in between), the allocate answers AllocateStatus::kHitLost and
  // changes nothing: reset the request and look it up again. `limit` caps the hit (at most
  // limit tokens, e.g. vLLM's max_cache_hit_length or EAGLE's last-block rule): the
  // longest prefix valid in every group among those of at most limit tokens; a shared
  // tier's candidates stop there too.
  std::uint64_t lookup_prefix(RequestId r, std::uint64_t limit = kMaxTokens);
  // Hits from a shared KV tier (KVTier): kvmm/manager/tier_admission.hpp, a companion
  // over this manager.

  // Pages for tokens [computed, computed + num_new_tokens + lookahead) in every group
  // (kOk), or nothing changed: kNoMemory, or kHitLost when pages of the looked-up hit were
  // evicted since lookup_prefix (counted in counters().lost_hits; reset(r) and look it up
  // again). Pins the lookup's hit first (an admission). May evict (Jenga §5.4) and add
  // copy-on-write copies. The result converts to bool: true exactly for kOk.
  AllocateResult allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead = 0);
  // Whether allocate(r, num_new_tokens, lookahead) would succeed now; changes nothing a later
  // call sees (a pending hit is pinned and given back as a refused allocate gives it back).
  // false also where the hit was evicted since lookup_prefix (allocate would return
  // kHitLost). Not for a pending tier hit nor with a large_page_source. Cost: allocate's
  // check (+ O(hit pages)). Where only memory held for retention stands in the way, it is
  // released as allocate would release it (the pages stay cached; retention_release).
  bool would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead = 0);
  // Tokens [0, num_computed_tokens) now hold KV: full pages become cached, pages out of
  // every policy's need are released. Raises kvmm::Error past the allocated tokens, and for
  // a write into a page shared since fork that no allocate planned a copy of.
  void commit(RequestId r, std::uint64_t num_computed_tokens);
  // Raises exactly what commit(r, num_computed_tokens) would raise, and changes nothing: a
  // batch of commits can be checked whole before any is made. O(groups).
  void check_commit(RequestId r, std::uint64_t num_computed_tokens) const;
  // A new request sharing parent's computed pages (reference counts +1); a shared partial
  // page is copied on the next write (copies()).
  RequestId fork(RequestId parent);
  void free(RequestId r);
  // Preemption by recompute, or giving up a first allocate that failed: releases every
  // page of r (cached ones stay evictable, as free leaves them) and returns r to its state
  // after add_request, its token ids and block hashes kept, so the next lookup_prefix
  // hashes nothing again (a 128k-token prompt: ~100 us saved per retry). O(pages held).
  void reset(RequestId r);
  // Preemption by swapping: every page of r to the host pool, all or nothing (std::nullopt:
  // host full, nothing changed). The span stays valid until the next swap call.
  std::optional<std::span<const PageCopy>> swap_out(RequestId r);
  std::optional<std::span<const PageCopy>> swap_in(RequestId r);
  // Copy-on-write copies made since begin_step().
  std::span<const PageCopy> copies() const;
  // Drops every cached hash (swapped-out pages' too); evictable pages become empty. O(pages).
  void reset_prefix_cache();
  // Keeps r's cached pages from eviction until unpin (a reference each). O(pages).
  PinId pin_prefix(RequestId r);
  void unpin(PinId pin);
  void set_priority(RequestId r, std::uint32_t priority);

  // ---- speculative decoding (docs/speculative.md)
  // The draft positions r's engine computes in draft group g (LayerGroup::draft) before its
  // first step, after the allocate that admits r: [the draft's own hit, the hit). A draft
  // group never shortens the hit; where its pages are missing inside it they are fresh
  // and the engine fills them (the draft is small). Empty before lookup_prefix and without
  // a hit. kvmm::Error for a group that is not a draft. O(1).
  TokenRange draft_recompute(RequestId r, GroupId g) const;
  // Group g's state page (LayerGroup::tagged_checkpoints) of r holds exactly the state after
  // positions [0, state_tokens) (the engine reports each state it wrote in the step, after
  // commit(r, verified)): cached when every one of them is verified (<= r's committed
  // tokens), it is a checkpoint (a multiple of the interval) and the page is still r's; true
  // when its content is cached now. A state over a draft position is refused (false), so no
  // cached state ever holds a rejected token. kvmm::Error, nothing changed, for a group
  // without tagged checkpoints, state_tokens = 0 or past r's allocated tokens. O(1).
  bool tag_state(RequestId r, GroupId g, std::uint64_t state_tokens);

  // Whether image `item` (its hash and length; offset ignored) is cached whole, under LoRA
  // `lora_id`, in every encoder-token group (cross attention, vision embedding). An image's
  // pages are keyed by the image alone, so a request's first allocate takes them from the
  // cache whenever this would answer true then, whatever text comes before the image.
  // false when the layout has no such group or prefix caching is off. O(pages of the image).
  bool cached_image(const MultimodalItem& item, std::uint32_t lora_id = 0) const;
  // After r's first allocate (until reset): whether the pages of r's image `item` (its index
  // in RequestExtras::items) in every encoder-token group that needs them came from the
  // cache: the engine skips the vision encoder for it exactly when this is true. Pages can
  // leave the cache between cached_image and allocate; this is allocate's own answer.
  // false before the first allocate. kvmm::Error for an item out of range. O(1).
  bool image_from_cache(RequestId r, std::uint32_t item) const;
  CacheStats stats() const;
  // After r's lookup_prefix (until its reset): per group how far it alone would have hit
  // and why it stopped (kvmm/manager/miss_reasons.hpp). kvmm::Error unless
  // KVCacheManagerOptions::miss_reasons is on, or before r's lookup. O(1).
  const LookupReport& lookup_report(RequestId r) const;
  // r's tokens read from the cache (admitted hits) and written to it (pages its commits
  // newly cached), while r is active (read it before free). O(1).
  CacheUsage cache_usage(RequestId r) const;
  // The O(1) counters (O(groups) for the per-group gauges), for metrics on every step.
  ManagerCounters counters() const;
  // Moves the recorded events into `out` (cleared first; capacities swap, so a reused
  // vector makes no heap allocation in steady state).
  void take_events(std::vector<CacheEvent>& out);
  // Moves the recorded KV events (record_kv_events) into `out`, the same way: a batch
  // passed back every step makes no heap allocation once grown. Events are in the order
  // things happened; a stored run is one request's consecutive newly cached pages of one
  // decoder group (medium: device). Encoder-token groups (cross attention, vision
  // embedding) emit none: their pages are keyed by image, and a router learns of the image
  // from the extra keys of the decoder pages it overlaps. A page whose hash moves to a
  // copy of the same content (issue 17's hand-over) emits nothing: the hash stays cached.
  void take_events(KvEventBatch& out);

  // Queries. A stale or unknown handle raises kvmm::Error (is_active answers false).
  bool is_active(RequestId r) const;
  bool is_swapped(RequestId r) const;
  std::uint32_t num_active() const;
  std::uint64_t num_computed(RequestId r) const;
  std::uint64_t num_allocated(RequestId r) const;
  std::uint64_t num_tokens(RequestId r) const;
  std::span<const PageId> page_table(RequestId r, GroupId g) const;
  // The kernels' inputs (block tables, kv lengths, the fused decode step):
  // kvmm/manager/kernel_exports.hpp, a companion over this manager.
  const LargePagePool& large_pages() const;
  const SmallPageAllocator& small_pages(GroupId g) const;
  // Group g's page counts: O(1), unlike stats().
  PageCounts page_counts(GroupId g) const;
  // Recomputes every count, list and reference from scratch; raises kvmm::Error naming the
  // first mismatch. O(memory); for tests and debug builds.
  void check_invariants() const;

 private:
  friend class testing::ManagerInspector;
  friend class TierAdmission;  // the tier calls reach the core through it alone
  friend class KernelExports;  // so do the kernel exports
  std::unique_ptr<detail::ManagerCore> core_;
};

}  // namespace kvmm
