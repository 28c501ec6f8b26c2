// HostOffloadBuffer: eLLM's CPU buffer (§4.3.2, §4.4.2): host pages of the KV page size;
// offload()/fetch() append device->host / host->device copy plans for a request's pages.
// Its usable size is a logical buffer scaled by SLO violations (eLLM Algorithm 2).
// Planning is O(pages log pages) (the repeat check); the caller copies (cudaMemcpyAsync,
// or copy_to_host/device).
#pragma once

#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvmm {

// One page copy; offsets are bytes from the device arena base and the host buffer base.
// (Named apart from the manager's PageCopy, a page-id plan: both are in namespace kvmm.)
struct OffloadCopy {
  std::uint64_t device_offset = 0;
  std::uint64_t host_offset = 0;
  std::uint64_t bytes = 0;
};

class HostOffloadBuffer {
 public:
  // `capacity_pages` pages of `page_bytes` each (B_max); the logical size starts at
  // `initial_logical_pages` (Algorithm 2 starts at 1). Raises kvmm::Error for a zero
  // size, a product past 64 bits, or host memory that cannot be mapped.
  HostOffloadBuffer(std::uint64_t page_bytes, std::uint32_t capacity_pages, std::uint32_t initial_logical_pages = 1);
  ~HostOffloadBuffer();
  HostOffloadBuffer(const HostOffloadBuffer&) = delete;
  HostOffloadBuffer& operator=(const HostOffloadBuffer&) = delete;

  // Appends one device->host copy per page to `plan` and records the host pages as the
  // request's. false, nothing changed, if the logical buffer lacks room. Raises
  // kvmm::Error, nothing changed, if the request already has pages offloaded, or a
  // device page is the null page, listed twice, or past 64-bit byte offsets.
  bool offload(RequestId r, std::span<const PageId> device_pages, std::uint64_t device_page_bytes,
               std::vector<OffloadCopy>& plan);
  // Appends one host->device copy per page (into `device_pages`, in the order they were
  // offloaded) and frees the request's host pages. Raises kvmm::Error, nothing changed,
  // if the count differs from what was offloaded or a device page is invalid as above.
  void fetch(RequestId r, std::span<const PageId> device_pages, std::uint64_t device_page_bytes,
             std::vector<OffloadCopy>& plan);
  // Frees a request's host pages without copying (the request was aborted).
  void drop(RequestId r);

  // eLLM Algorithm 2: a TPOT violation shrinks the logical buffer to max(B/alpha, 1),
  // otherwise a TTFT violation grows it to min(B*alpha, B_max) (the paper's
  // min(B*alpha, B_logic) is read as B_max: the text bounds it by the physical size).
  void on_slo_events(bool ttft_violation, bool tpot_violation, double alpha = 2.0);
  std::uint32_t logical_pages() const { return logical_; }
  std::uint32_t capacity_pages() const { return capacity_; }
  std::uint32_t used_pages() const { return used_; }
  // Pages the scheduler may still offload (P_B): logical size minus used, or 0.
  std::uint32_t free_logical_pages() const { return logical_ > used_ ? logical_ - used_ : 0; }
  std::uint32_t pages_of(RequestId r) const {
    const auto it = owned_.find(r);
    return it == owned_.end() ? 0 : static_cast<std::uint32_t>(it->second.size());
  }
  std::uint64_t page_bytes() const { return page_bytes_; }
  std::byte* data() const { return data_; }

  // Raises kvmm::Error naming the first broken invariant (every host page free or held
  // by exactly one request, counters agree). O(capacity).
  void check_invariants() const;

  // Executes a plan with memcpy between a host-visible arena and this buffer.
  void copy_to_host(std::span<const OffloadCopy> plan, const std::byte* device_base) const;
  void copy_to_device(std::span<const OffloadCopy> plan, std::byte* device_base) const;

 private:
  std::uint64_t page_bytes_;
  std::uint32_t capacity_;
  std::uint32_t logical_;
  std::uint32_t used_ = 0;
  std::byte* data_ = nullptr;
  void check_device_pages(std::span<const PageId> device_pages);

  std::vector<std::uint32_t> free_;  // stack of free host pages
  // Per request holding pages: its host pages in offload order. Keyed by id, so any
  // 32-bit request id costs one entry, not a table up to it.
  std::unordered_map<RequestId, std::vector<std::uint32_t>> owned_;
  std::vector<PageId> sorted_;  // scratch for the repeat check
};

}  // namespace kvmm
