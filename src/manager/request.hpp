// A request row's record (private to src/manager/): its Phase, a checked state machine,
// and its state as sub-records (progress, hit, tier hit, retention, images), so that
// starting, restarting and forking a row reset or copy whole records, never field lists.
// Each reset() keeps its vectors' capacity: a recycled row does not touch the heap. The
// phase check costs one table read at debug tier 1 and nothing below it.
#pragma once

#include "kvmm/caching/request_hashes.hpp"
#include "kvmm/detail/debug_checks.hpp"
#include "kvmm/manager/miss_reasons.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "kvmm/types.hpp"
#include "retention.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvmm::detail {

// Where a request is in its life, after vLLM's RequestStatus. The calls each phase allows
// are checked where they are made (with a kvmm::Error naming the call); the transitions
// themselves are checked by to() at debug tier 1.
enum class Phase : std::uint8_t {
  kFree,        // the row serves no request
  kRegistered,  // add_request, or reset: lookup_prefix or a first allocate next
  kLookedUp,    // lookup_prefix answered: the first allocate pins the hit (Hit::pending)
  kListed,      // tier_candidates listed keys: extend_prefix answers them
  kAdmitting,   // extend_prefix found tier pages: the admitting allocate lists their loads
  kLoading,     // admitted with tier loads in flight: finish_loads next
  kRunning,     // admitted: allocate, commit, fork, swap_out, free
  kSwapped,     // its pages are on the host: swap_in or free
};

// Whether a request may move from one phase to another (O(1)).
constexpr bool allowed(Phase from, Phase to) {
  using enum Phase;
  if (to == kFree) return from != kFree;  // free
  if (to == kRegistered) return true;     // add_request (from kFree), reset (from any other)
  switch (from) {
    case kFree:
      return to == kLookedUp || to == kRunning;  // fork
    case kRegistered:
      return to == kLookedUp || to == kRunning || to == kSwapped;
    case kLookedUp:
      return to == kListed || to == kRunning || to == kLoading || to == kSwapped;
    case kListed:
      return to == kListed || to == kLookedUp || to == kAdmitting || to == kRunning || to == kLoading || to == kSwapped;
    case kAdmitting:
      return to == kListed || to == kLoading;
    case kLoading:
      return to == kRunning;
    case kRunning:
      return to == kSwapped;
    case kSwapped:
      return to != kSwapped && to != kLoading;  // swap_in: back to the phase it left
  }
  return false;
}

// Computed and allocated tokens, and per group the row's window (first page held) and
// the pages considered for caching.
struct Progress {
  std::uint64_t computed = 0, allocated = 0, last_step = 0;
  std::uint64_t step_end = 0;             // computed + the tokens its last allocate scheduled
  std::vector<std::uint64_t> lo;          // per group: first page still held
  std::vector<std::uint64_t> registered;  // per group: pages considered for caching

  void reset() {
    computed = allocated = last_step = step_end = 0;
    std::fill(lo.begin(), lo.end(), 0);
    std::fill(registered.begin(), registered.end(), 0);
  }
};

// The lookup's hit: `tokens` found (pinned by the first allocate while `pending`).
struct Hit {
  bool pending = false;
  std::uint64_t tokens = 0;
  std::uint64_t lookup_tokens = 0;  // tokens its lookup_prefix looked up (admission counts)
  std::uint64_t limit = 0;          // the longest hit its lookup allowed (prompt - 1, or the caller's cap)
  std::uint64_t branch = 0;         // its lookup's whole-prefix hit (>= tokens): a branch point if more
  // A hit ending inside a page (hit_unit): the last `partial` tokens of `tokens` are the
  // first ones of page tokens / P, copied from partial_src[g] (cached under
  // partial_full[g]) into the request's fresh page at admission. Vectors keep capacity.
  std::uint64_t partial = 0;
  std::vector<PageId> partial_src;
  std::vector<BlockHash> partial_full;

  void reset() {
    pending = false;
    tokens = lookup_tokens = limit = branch = partial = 0;
  }
};

// A shared tier's part of the hit (tier_hits.cpp). tier_candidates lists group g's pages
// [lo[g], + n[g]) at off[g] of the list; extend_prefix keeps which are present; the
// allocate that admits the hit lists the loads (load_idx: their page index) and takes
// fill[g] fresh pages for them; finish_loads ends the loading phase.
struct TierHit {
  bool pending = false;     // the hit has tier pages (extend_prefix), until the admitting allocate
  std::uint64_t keys = 0;   // candidates listed
  std::uint64_t local = 0;  // the local part of the hit (extend_prefix's lookup)
  std::vector<std::uint64_t> lo, n, off;
  std::vector<std::uint32_t> fill;
  std::vector<std::uint8_t> present;
  std::vector<TierLoad> loads;
  std::vector<std::uint64_t> load_idx;

  void reset() {
    pending = false;
    keys = local = 0;
    std::fill(fill.begin(), fill.end(), 0);
    loads.clear();
    load_idx.clear();
  }
};

// Boundary-aware retention: the request's cache boundaries and the pages it holds for
// them after they left its table's window.
struct Retention {
  CacheBoundaries bounds;              // hinted at add_request, learned ones merged in
  std::vector<HeldPage> held;          // pages held for a boundary after leaving the table's window
  std::vector<std::uint32_t> held_in;  // per group: how many of held

  void reset() {
    bounds.clear();
    held.clear();
    std::fill(held_in.begin(), held_in.end(), 0);
  }
};

// The request's images (encoder-token groups).
struct Images {
  bool ready = false;                            // its first allocate placed every image's pages
  bool registered = false;                       // its first commit cached them
  std::uint32_t consumed = 0;                    // images wholly before the computed tokens
  std::vector<std::uint64_t> rank;               // random prefix length per item
  std::vector<std::uint8_t> cached;              // per image: came from the cache (image_from_cache)
  std::vector<std::vector<std::uint64_t>> page;  // per encoder group: item k's first page

  // Progress over the images forgotten (a restart); their pages and ranks stay.
  void restart() {
    ready = registered = false;
    consumed = 0;
    cached.clear();
  }
};

// Miss reasons and per-request accounting (miss_reasons.hpp).
struct MissRecord {
  bool reported = false;  // report holds r's last lookup (miss_reasons on)
  bool has_plain = false;
  BlockHash plain;  // its first page's key without extra keys (miss_reasons on)
  LookupReport report;
  CacheUsage usage;  // always kept

  // A new request (add_request, fork): nothing reported or used yet; the report's capacity stays.
  void start() {
    reported = has_plain = false;
    usage = CacheUsage{};
  }
};

// Speculative decoding's draft groups (draft_groups.hpp): per group, the successor-token
// keys of the request's pages (kept across reset: the ids do not change) and the draft's
// own hit at the last lookup (<= the hit; the engine recomputes the draft from there).
struct Drafts {
  std::vector<std::vector<BlockHash>> keys;  // per group (empty unless successor-keyed)
  std::vector<std::uint64_t> hit;            // per group

  void reset() { std::fill(hit.begin(), hit.end(), 0); }
  void clear() {
    reset();
    for (std::vector<BlockHash>& k : keys) k.clear();
  }
};

struct Request {
  Phase phase = Phase::kFree;
  Phase swapped_from = Phase::kFree;  // the phase swap_in returns to
  bool was_reset = false;             // reset (preempted) since add: its lookups find its own pages
  std::uint32_t prio = 0;
  std::uint64_t prompt = 0;  // the prompt's tokens (RequestExtras::prompt_tokens or the ids given)
  RequestHashes ids;         // token ids, extra keys and block-hash chains
  Progress progress;
  Hit hit;
  TierHit tier;
  Retention keep;
  Images images;
  MissRecord miss;
  Drafts drafts;

  bool active() const { return phase != Phase::kFree; }
  bool swapped() const { return phase == Phase::kSwapped; }
  bool loading() const { return phase == Phase::kLoading; }
  bool listed() const { return phase == Phase::kListed; }
  // lookup_prefix has answered (or the row was forked): no second lookup.
  bool looked_up() const { return phase != Phase::kRegistered && phase != Phase::kFree; }
  // Its first allocate succeeded: only then do its pages count as accessed (a request that
  // looked up and could not be admitted leaves the hit pages' ages alone).
  bool admitted() const {
    const Phase p = phase == Phase::kSwapped ? swapped_from : phase;
    return p == Phase::kRunning || p == Phase::kLoading;
  }
  void to(Phase next) {
    KVMM_ASSERT(allowed(phase, next));
    phase = next;
  }
};

}  // namespace kvmm::detail
