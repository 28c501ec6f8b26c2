#include "kvmm/memory/host_offload.hpp"

#include "kvmm/error.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvmm {

HostOffloadBuffer::HostOffloadBuffer(std::uint64_t page_bytes, std::uint32_t capacity_pages,
                                     std::uint32_t initial_logical_pages)
    : page_bytes_(page_bytes), capacity_(capacity_pages), logical_(initial_logical_pages) {
  if (page_bytes == 0) fail("page_bytes = {}: must be positive", page_bytes);
  if (capacity_pages == 0) fail("capacity_pages = {}: must be positive", capacity_pages);
  if (initial_logical_pages == 0 || initial_logical_pages > capacity_pages)
    fail("initial_logical_pages = {}: must be in [1, {}]", initial_logical_pages, capacity_pages);
  void* p = mmap(nullptr, page_bytes * capacity_pages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("capacity_pages = {}: cannot map {} bytes of host memory", capacity_pages, page_bytes * capacity_pages);
  data_ = static_cast<std::byte*>(p);
  free_.resize(capacity_pages);
  for (std::uint32_t i = 0; i < capacity_pages; ++i) free_[i] = capacity_pages - 1 - i;
}

HostOffloadBuffer::~HostOffloadBuffer() { munmap(data_, page_bytes_ * capacity_); }

bool HostOffloadBuffer::offload(RequestId r, std::span<const PageId> device_pages, std::uint64_t device_page_bytes,
                                std::vector<PageCopy>& plan) {
  if (r == kNoRequest) fail("request = {}: not a request id", r);
  if (device_page_bytes != page_bytes_) fail("device_page_bytes = {}: buffer pages are {} bytes", device_page_bytes, page_bytes_);
  if (pages_of(r) != 0) fail("request = {}: already has {} pages offloaded", r, pages_of(r));
  for (std::size_t i = 0; i < device_pages.size(); ++i)
    if (device_pages[i] == kNullPage) fail("device_pages[{}] = {}: the null page holds no data", i, device_pages[i]);
  if (device_pages.size() > free_logical_pages() || device_pages.size() > free_.size()) return false;
  if (owned_.size() <= r) owned_.resize(std::size_t{r} + 1);
  auto& mine = owned_[r];
  for (PageId p : device_pages) {
    const std::uint32_t h = free_.back();
    free_.pop_back();
    mine.push_back(h);
    plan.push_back(PageCopy{std::uint64_t{p} * page_bytes_, std::uint64_t{h} * page_bytes_, page_bytes_});
  }
  used_ += static_cast<std::uint32_t>(device_pages.size());
  return true;
}

void HostOffloadBuffer::fetch(RequestId r, std::span<const PageId> device_pages, std::uint64_t device_page_bytes,
                              std::vector<PageCopy>& plan) {
  if (device_page_bytes != page_bytes_) fail("device_page_bytes = {}: buffer pages are {} bytes", device_page_bytes, page_bytes_);
  if (device_pages.size() != pages_of(r))
    fail("device_pages.size() = {}: request {} has {} pages offloaded", device_pages.size(), r, pages_of(r));
  for (std::size_t i = 0; i < device_pages.size(); ++i)
    if (device_pages[i] == kNullPage) fail("device_pages[{}] = {}: not a page", i, device_pages[i]);
  if (device_pages.empty()) return;
  auto& mine = owned_[r];
  for (std::size_t i = 0; i < mine.size(); ++i)
    plan.push_back(PageCopy{std::uint64_t{device_pages[i]} * page_bytes_, std::uint64_t{mine[i]} * page_bytes_, page_bytes_});
  drop(r);
}

void HostOffloadBuffer::drop(RequestId r) {
  if (r >= owned_.size()) return;
  auto& mine = owned_[r];
  for (std::size_t i = mine.size(); i-- > 0;) free_.push_back(mine[i]);
  used_ -= static_cast<std::uint32_t>(mine.size());
  mine.clear();
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
  for (std::size_t r = 0; r < owned_.size(); ++r)
    for (std::uint32_t h : owned_[r]) {
      if (h >= capacity_ || seen[h]++) fail("host offload buffer: page {} of request {} is also free or held twice", h, r);
      ++used;
    }
  if (used != used_ || used + free_.size() != capacity_)
    fail("host offload buffer: {} pages held, counter says {}, {} free of {}", used, used_, free_.size(), capacity_);
  if (logical_ < 1 || logical_ > capacity_) fail("host offload buffer: logical size {} outside [1, {}]", logical_, capacity_);
}

void HostOffloadBuffer::copy_to_host(std::span<const PageCopy> plan, const std::byte* device_base) const {
  for (const PageCopy& c : plan) std::memcpy(data_ + c.host_offset, device_base + c.device_offset, c.bytes);
}

void HostOffloadBuffer::copy_to_device(std::span<const PageCopy> plan, std::byte* device_base) const {
  for (const PageCopy& c : plan) std::memcpy(device_base + c.device_offset, data_ + c.host_offset, c.bytes);
}

}  // namespace kvmm
