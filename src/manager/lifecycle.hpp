// Lifecycle (private to src/manager/): a request after admission and its ends. add_request
// (hashes the prompt, O(tokens)), commit (caches full pages, O(new pages); releases pages
// out of every policy's need, O(released)), fork (O(pages)), free and reset (O(pages
// held)), prefix pins, and reset_prefix_cache (O(pages)).
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class Lifecycle {
 public:
  explicit Lifecycle(ManagerCore& m) : m_(m) {}
  // commit of r at its row; the *_at forms take the row resolved (decode_step resolves rows once).
  void commit(RequestId r, std::uint64_t num_computed_tokens);
  void check_commit(RequestId r, std::uint64_t num_computed_tokens) const;
  Lifecycle(const Lifecycle&) = delete;
  Lifecycle& operator=(const Lifecycle&) = delete;

  RequestId add_request(std::span<const std::uint32_t> tokens, const RequestExtras& extras);
  void clear_progress(Request& q);
  void append_tokens(RequestId r, std::span<const std::uint32_t> tokens);
  void set_priority(RequestId r, std::uint32_t priority);
  void check_shared_write(RequestId r, Row s, const Request& q, std::uint64_t c) const;
  void register_full_pages(Row s, Request& q, std::uint64_t c);
  void release_out_of_window(Row s, Request& q, std::uint64_t c0, std::uint64_t c);
  void check_commit_at(RequestId r, Row s, std::uint64_t c) const;
  void commit_at(RequestId r, Row s, std::uint64_t num_computed_tokens);
  RequestId fork(RequestId parent);
  void cache_partial_pages(Row s, Request& q);
  void release_rows(Row s, Request& q);
  void release_all(Row s, Request& q);
  void free(RequestId r);
  void reset(RequestId r);
  void reset_prefix_cache();
  PinId pin_prefix(RequestId r);
  void unpin(PinId pin);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
