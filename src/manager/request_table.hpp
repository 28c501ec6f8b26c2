// The manager's requests (private to src/manager/): one record per request row, reused,
// and the handles the engine holds. A handle packs the row with the row's generation,
// which rises at every free, so a handle kept past free() (a stale one) is refused with
// kvmm::Error instead of acting on the row's next request. Lookups are O(1); no heap use
// once a row's buffers have grown.
#pragma once

#include "kvmm/caching/request_hashes.hpp"
#include "kvmm/error.hpp"
#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/manager/tier_admission.hpp"
#include "kvmm/types.hpp"
#include "retention.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

namespace kvmm::detail {

struct Request {
  bool active = false, swapped = false, looked_up = false, enc_ready = false, enc_registered = false;
  // Its first allocate succeeded: only then do its pages count as accessed (a request that
  // looked up and could not be admitted leaves the hit pages' ages alone).
  bool admitted = false;
  // lookup_prefix found `hit` tokens that allocate has not pinned yet.
  bool hit_pending = false;
  std::uint64_t hit = 0;
  std::uint64_t lookup_tokens = 0;       // tokens its lookup_prefix looked up (admission counts)
  RequestHashes ids;                     // token ids, extra keys and block-hash chains
  std::vector<std::uint64_t> item_rank;  // random prefix length per item
  std::uint32_t prio = 0;
  std::uint64_t computed = 0, allocated = 0, last_step = 0;
  std::uint64_t step_end = 0;  // computed + the tokens its last allocate scheduled
  std::uint32_t items_consumed = 0;
  // Per image: at admission its pages in every encoder-token group needing them came
  // from the cache (image_from_cache); empty before the first allocate.
  std::vector<std::uint8_t> item_cached;
  std::vector<std::uint64_t> lo;                      // per group: first page still held
  std::vector<std::uint64_t> registered;              // per group: pages considered for caching
  std::vector<std::vector<std::uint64_t>> item_page;  // per encoder group: item k's first page
  CacheBoundaries bounds;                             // hinted at add_request, learned ones merged in
  std::vector<HeldPage> held;                         // pages held for a boundary after leaving the table's window
  std::vector<std::uint32_t> held_in;                 // per group: how many of held
  std::uint64_t branch = 0;                           // its lookup's whole-prefix hit (>= hit): a branch point if more
  bool was_reset = false;                             // reset (preempted) since add: its lookups find its own pages
  // A shared tier's part of the hit (tier_hits.cpp). tier_candidates lists group g's
  // pages [tier_lo[g], + tier_n[g]) at tier_off[g] of the list; extend_prefix keeps which
  // are present; the allocate that admits the hit lists the loads (load_idx: their page
  // index) and takes tier_fill[g] fresh pages for them; finish_loads ends `loading`.
  bool tier_listed = false, tier_pending = false, loading = false;
  std::uint64_t tier_keys = 0;   // candidates listed
  std::uint64_t tier_local = 0;  // the local part of the hit (extend_prefix's lookup)
  std::vector<std::uint64_t> tier_lo, tier_n, tier_off;
  std::vector<std::uint32_t> tier_fill;
  std::vector<std::uint8_t> tier_present;
  std::vector<TierLoad> loads;
  std::vector<std::uint64_t> load_idx;

  // No tier hit listed, pending or loading: a row's state at add_request and fork (a
  // recycled row may hold its previous request's).
  void clear_tier() {
    tier_listed = tier_pending = loading = false;
    tier_keys = tier_local = 0;
    std::fill(tier_fill.begin(), tier_fill.end(), 0);
    loads.clear();
    load_idx.clear();
  }
};

class RequestTable {
 public:
  RequestTable(std::uint32_t max_requests, std::uint32_t num_groups)
      : reqs_(max_requests),
        gen_(max_requests, 1),
        row_bits_(max_requests > 1 ? static_cast<std::uint32_t>(std::bit_width(max_requests - 1u)) : 0),
        max_gen_((std::uint64_t{1} << (32 - row_bits_)) - 2) {
    for (Request& q : reqs_) {
      q.lo.assign(num_groups, 0);
      q.registered.assign(num_groups, 0);
      q.held_in.assign(num_groups, 0);
      q.tier_lo.assign(num_groups, 0);
      q.tier_n.assign(num_groups, 0);
      q.tier_off.assign(num_groups, 0);
      q.tier_fill.assign(num_groups, 0);
      q.item_page.resize(num_groups);
    }
    free_.reserve(max_requests);
    for (std::uint32_t s = max_requests; s-- > 0;) free_.push_back(s);
  }

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(reqs_.size()); }
  std::uint32_t num_active() const { return num_active_; }
  bool full() const { return free_.empty(); }

  // The row the next take() hands out, and its handle; nothing changes.
  std::uint32_t next_row() const { return free_.back(); }
  RequestId handle_of(std::uint32_t row) const { return (gen_[row] << row_bits_) | row; }
  // Takes the next row (must not be full()); returns its handle.
  RequestId take() {
    const std::uint32_t s = free_.back();
    free_.pop_back();
    reqs_[s].active = true;
    ++num_active_;
    return handle_of(s);
  }
  // Gives the row back; its handles become stale.
  void give_back(std::uint32_t row) {
    reqs_[row].active = false;
    gen_[row] = gen_[row] == max_gen_ ? 1 : gen_[row] + 1;
    free_.push_back(row);
    --num_active_;
  }

  // The row of an active request's handle; kvmm::Error naming the handle otherwise.
  std::uint32_t row(RequestId r) const {
    const std::uint32_t s = r & ((std::uint32_t{1} << row_bits_) - 1u);
    if (s < reqs_.size() && reqs_[s].active && handle_of(s) == r) [[likely]]
      return s;
    bad(r);
  }
  bool is_active(RequestId r) const {
    const std::uint32_t s = r & ((std::uint32_t{1} << row_bits_) - 1u);
    return s < reqs_.size() && reqs_[s].active && handle_of(s) == r;
  }
  Request& operator[](std::uint32_t row) { return reqs_[row]; }
  const Request& operator[](std::uint32_t row) const { return reqs_[row]; }

 private:
  [[noreturn, gnu::cold]] void bad(RequestId r) const {
    const std::uint32_t s = r & ((std::uint32_t{1} << row_bits_) - 1u);
    if (s >= reqs_.size() || (r >> row_bits_) == 0 || (r >> row_bits_) > max_gen_)
      fail("request = {}: not an active request (not a handle this manager issued)", r);
    if (!reqs_[s].active) fail("request = {}: not an active request (freed)", r);
    fail("request = {}: not an active request (a stale handle: its row serves a newer request)", r);
  }

  std::vector<Request> reqs_;
  std::vector<std::uint32_t> gen_;
  std::vector<std::uint32_t> free_;
  std::uint32_t row_bits_;
  std::uint32_t max_gen_;
  std::uint32_t num_active_ = 0;
};

}  // namespace kvmm::detail
