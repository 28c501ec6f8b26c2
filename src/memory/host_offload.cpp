#include "kvmm/memory/host_offload.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace kvmm {

HostOffloadBuffer::HostOffloadBuffer(std::uint64_t page_bytes, std::uint32_t capacity_pages,
                                     std::uint32_t initial_logical_pages)
    : page_bytes_(page_bytes), capacity_(capacity_pages), logical_(initial_logical_pages) {
  if (page_bytes == 0) fail("page_bytes = {}: must be positive", page_bytes);
  if (capacity_pages == 0) fail("capacity_pages = {}: must be positive", capacity_pages);
  if (initial_logical_pages == 0 || initial_logical_pages > capacity_pages)
    fail("initial_logical_pages = {}: must be in [1, {}]", initial_logical_pages, capacity_pages);
  const std::uint64_t bytes = checked_mul(page_bytes, capacity_pages, "page_bytes * capacity_pages");
  // Host bookkeeping first, the buffer last: a failure leaves nothing to undo.
  free_.resize(capacity_pages);
  for (std::uint32_t i = 0; i < capacity_pages; ++i) free_[i] = capacity_pages - 1 - i;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("capacity_pages = {}: cannot map {} bytes of host memory", capacity_pages, bytes);
  data_ = static_cast<std::byte*>(p);
}

HostOffloadBuffer::~HostOffloadBuffer() { munmap(data_, page_bytes_ * capacity_); }

// No null page, no page twice, every byte offset within 64 bits.
void HostOffloadBuffer::check_device_pages(std::span<const PageId> device_pages) {
  for (std::size_t i = 0; i < device_pages.size(); ++i) {
    if (device_pages[i] == kNullPage) fail("device_pages[{}] = {}: the null page holds no data", i, device_pages[i]);
    if (!try_mul<std::uint64_t>(device_pages[i], page_bytes_))
      fail("device_pages[{}] = {}: its byte offset ({} bytes a page) overflows 64 bits", i, device_pages[i],
           page_bytes_);
  }
  sorted_.assign(device_pages.begin(), device_pages.end());
  std::sort(sorted_.begin(), sorted_.end());
  const auto dup = std::adjacent_find(sorted_.begin(), sorted_.end());
  if (dup == sorted_.end()) return;
  std::size_t second = 0;
  for (std::size_t i = 0, seen = 0; i < device_pages.size(); ++i)
    if (device_pages[i] == *dup && seen++ == 1) second = i;
  fail("device_pages[{}] = {}: listed twice (two copies would target one page)", second, *dup);
}

bool HostOffloadBuffer::offload(RequestId r, std::span<const PageId> device_pages, std::uint64_t device_page_bytes,
                                std::vector<OffloadCopy>& plan) {
  if (r == kNoRequest) fail("request = {}: not a request id", r);
  if (device_page_bytes != page_bytes_)
    fail("device_page_bytes = {}: buffer pages are {} bytes", device_page_bytes, page_bytes_);
  if (pages_of(r) != 0) fail("request = {}: already has {} pages offloaded", r, pages_of(r));
  check_device_pages(device_pages);
  if (device_pages.size() > free_logical_pages() || device_pages.size() > free_.size()) return false;
  if (device_pages.empty()) return true;
  // Every allocation before the first change, so bad_alloc leaves the buffer as it was.
  std::vector<std::uint32_t> mine;
  mine.reserve(device_pages.size());
  plan.reserve(plan.size() + device_pages.size());
  auto& entry = owned_[r];
  for (PageId p : device_pages) {
    const std::uint32_t h = free_.back();
    free_.pop_back();
    mine.push_back(h);
    plan.push_back(OffloadCopy{std::uint64_t{p} * page_bytes_, std::uint64_t{h} * page_bytes_, page_bytes_});
  }
  entry = std::move(mine);
  used_ += static_cast<std::uint32_t>(device_pages.size());
  return true;
}

void HostOffloadBuffer::fetch(RequestId r, std::span<const PageId> device_pages, std::uint64_t device_page_bytes,
                              std::vector<OffloadCopy>& plan) {
  if (device_page_bytes != page_bytes_)
    fail("device_page_bytes = {}: buffer pages are {} bytes", device_page_bytes, page_bytes_);
  if (device_pages.size() != pages_of(r))
    fail("device_pages.size() = {}: request {} has {} pages offloaded", device_pages.size(), r, pages_of(r));
  check_device_pages(device_pages);
  if (device_pages.empty()) return;
  const auto& mine = owned_.at(r);
  plan.reserve(plan.size() + mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i)
    plan.push_back(
        OffloadCopy{std::uint64_t{device_pages[i]} * page_bytes_, std::uint64_t{mine[i]} * page_bytes_, page_bytes_});
  drop(r);
}

void HostOffloadBuffer::drop(RequestId r) {
  const auto it = owned_.find(r);
  if (it == owned_.end()) return;
  const auto& mine = it->second;
  for (std::size_t i = mine.size(); i-- > 0;) free_.push_back(mine[i]);
  used_ -= static_cast<std::uint32_t>(mine.size());
  owned_.erase(it);
}

void HostOffloadBuffer::on_slo_events(bool ttft_violation, bool tpot_violation, double alpha) {
  if (!(alpha > 1.0)) fail("alpha = {}: must be above 1", alpha);
  if (tpot_violation) {
    logical_ = std::max<std::uint32_t>(static_cast<std::uint32_t>(std::floor(logical_ / alpha)), 1);
  } else if (ttft_violation) {
    const double grown = std::ceil(logical_ * alpha);
    logical_ = grown >= capacity_ ? capacity_ : static_cast<std::uint32_t>(grown);
  }
}

void HostOffloadBuffer::check_invariants() const {
  std::vector<std::uint8_t> seen(capacity_, 0);
  for (std::uint32_t h : free_)
    if (h >= capacity_ || seen[h]++) fail("host offload buffer: free page {} is out of range or listed twice", h);
  std::uint64_t used = 0;
  for (const auto& [r, mine] : owned_) {
    if (mine.empty()) fail("host offload buffer: request {} is listed with no pages", r);
    for (std::uint32_t h : mine) {
      if (h >= capacity_ || seen[h]++)
        fail("host offload buffer: page {} of request {} is also free or held twice", h, r);
      ++used;
    }
  }
  if (used != used_ || used + free_.size() != capacity_)
    fail("host offload buffer: {} pages held, counter says {}, {} free of {}", used, used_, free_.size(), capacity_);
  if (logical_ < 1 || logical_ > capacity_)
    fail("host offload buffer: logical size {} outside [1, {}]", logical_, capacity_);
}

void HostOffloadBuffer::copy_to_host(std::span<const OffloadCopy> plan, const std::byte* device_base) const {
  for (const OffloadCopy& c : plan) std::memcpy(data_ + c.host_offset, device_base + c.device_offset, c.bytes);
}

void HostOffloadBuffer::copy_to_device(std::span<const OffloadCopy> plan, std::byte* device_base) const {
  for (const OffloadCopy& c : plan) std::memcpy(device_base + c.device_offset, data_ + c.host_offset, c.bytes);
}

}  // namespace kvmm
