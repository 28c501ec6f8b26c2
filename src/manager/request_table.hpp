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
#include "request.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

namespace kvmm::detail {

class RequestTable {
 public:
  RequestTable(std::uint32_t max_requests, std::uint32_t num_groups)
      : reqs_(max_requests),
        gen_(max_requests, 1),
        row_bits_(max_requests > 1 ? static_cast<std::uint32_t>(std::bit_width(max_requests - 1u)) : 0),
        max_gen_((std::uint64_t{1} << (32 - row_bits_)) - 2) {
    for (Request& q : reqs_) {
      q.progress.lo.assign(num_groups, 0);
      q.progress.registered.assign(num_groups, 0);
      q.keep.held_in.assign(num_groups, 0);
      q.tier.lo.assign(num_groups, 0);
      q.tier.n.assign(num_groups, 0);
      q.tier.off.assign(num_groups, 0);
      q.tier.fill.assign(num_groups, 0);
      q.images.page.resize(num_groups);
      q.drafts.keys.resize(num_groups);
      q.drafts.hit.assign(num_groups, 0);
    }
    free_.reserve(max_requests);
    for (std::uint32_t s = max_requests; s-- > 0;) free_.push_back(s);
  }

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(reqs_.size()); }
  std::uint32_t num_active() const { return num_active_; }
  bool full() const { return free_.empty(); }

  // The row the next take() hands out, and its handle; nothing changes.
  Row next_row() const { return Row{free_.back()}; }
  RequestId handle_of(Row row) const { return (gen_[row.index] << row_bits_) | row.index; }
  // Takes the next row (must not be full()) into `phase`; returns its handle.
  RequestId take(Phase phase) {
    const Row s{free_.back()};
    free_.pop_back();
    reqs_[s.index].to(phase);
    ++num_active_;
    return handle_of(s);
  }
  // Gives the row back; its handles become stale.
  void give_back(Row row) {
    reqs_[row.index].to(Phase::kFree);
    gen_[row.index] = gen_[row.index] == max_gen_ ? 1 : gen_[row.index] + 1;
    free_.push_back(row.index);
    --num_active_;
  }

  // The row of an active request's handle; kvmm::Error naming the handle otherwise.
  Row row(RequestId r) const {
    const Row s{r & ((std::uint32_t{1} << row_bits_) - 1u)};
    if (s.index < reqs_.size() && reqs_[s.index].active() && handle_of(s) == r) [[likely]]
      return s;
    bad(r);
  }
  bool is_active(RequestId r) const {
    const Row s{r & ((std::uint32_t{1} << row_bits_) - 1u)};
    return s.index < reqs_.size() && reqs_[s.index].active() && handle_of(s) == r;
  }
  Request& operator[](Row row) { return reqs_[row.index]; }
  const Request& operator[](Row row) const { return reqs_[row.index]; }

 private:
  [[noreturn, gnu::cold]] void bad(RequestId r) const {
    const std::uint32_t s = r & ((std::uint32_t{1} << row_bits_) - 1u);
    if (s >= reqs_.size() || (r >> row_bits_) == 0 || (r >> row_bits_) > max_gen_)
      fail("request = {}: not an active request (not a handle this manager issued)", r);
    if (!reqs_[s].active()) fail("request = {}: not an active request (freed)", r);
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
