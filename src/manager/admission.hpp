// Admission (private to src/manager/): a request's way in. lookup_prefix (pure, O(pages
// probed)); allocate: pins the hit (O(hit pages)) or refuses before pinning (O(groups),
// O(hit pages) when close), then Jenga §5.4's steps for the pages the step needs, all or
// nothing (a feasibility replay, O(pages needed)); would_allocate, the same check alone.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class Admission {
 public:
  explicit Admission(ManagerCore& m) : m_(m) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  std::uint64_t lookup_prefix(RequestId r, std::uint64_t limit);
  AllocateResult allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead);
  // allocate of r at its row s = running(r) (decode_step resolves rows once).
  bool compute_need(Row s, const Request& q, std::uint32_t num_new_tokens, std::uint64_t target);
  void take_pages(Row s, Request& q);
  bool admit(RequestId r, Row s, Request& q);
  void release_unpinned_hit(Row s, Request& q);
  void give_back_admission(Row s, Request& q, bool pinning, bool images);
  void release_admission_pins(Row s, Request& q);
  std::uint64_t inside_page(Request& q, std::uint64_t p, std::uint64_t limit);
  bool hold_partial_sources(Row s, const Request& q);
  void drop_partial_holds(const Request& q);
  bool refused_before_pin(RequestId r, const Request& q);
  void check_refusal(RequestId r, Row s, Request& q, std::uint32_t num_new_tokens, std::uint64_t target);
  void begin_backing(Row s);
  AllocateResult refused(RequestId r, const Request& q, std::uint32_t num_new_tokens);
  AllocateResult allocate_at(RequestId r, Row s, std::uint32_t num_new_tokens, std::uint32_t lookahead);
  std::uint64_t need_bytes() const;
  AllocateResult allocate_once(RequestId r, Row s, std::uint32_t num_new_tokens, std::uint32_t lookahead);
  bool would_allocate(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead);
  bool would_allocate_once(RequestId r, std::uint32_t num_new_tokens, std::uint32_t lookahead);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
