#include "kvmm/memory/host_memory.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace kvmm {
namespace {

constexpr std::uint32_t kDead = std::numeric_limits<std::uint32_t>::max();

void* as_ptr(std::uint64_t addr) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)); }

}  // namespace

HostMemory::HostMemory(const HostMemoryOptions& options) {
  page_bytes_ = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  if (options.chunk_bytes == 0) fail("chunk_bytes = {}: must be positive", options.chunk_bytes);
  chunk_bytes_ = checked_round_up(options.chunk_bytes, page_bytes_, "chunk_bytes");
  max_chunks_ = options.max_chunks;
  fd_ = memfd_create("kvmm-host-memory", MFD_CLOEXEC);
  if (fd_ < 0) fail("memfd_create: {}", std::strerror(errno));
}

HostMemory::~HostMemory() {
  if (fd_ >= 0) close(fd_);
}

bool HostMemory::reserve(std::uint64_t bytes, VirtualRange* out) {
  if (bytes == 0) fail("bytes = {}: cannot reserve an empty range", bytes);
  const std::uint64_t size = checked_round_up(bytes, chunk_bytes_, "bytes");
  // Over-reserve by one chunk and trim, so the range is chunk aligned.
  const auto over = try_add(size, chunk_bytes_);
  if (!over) fail("bytes = {}: a range of {} bytes plus one chunk for alignment overflows 64 bits", bytes, size);
  void* p = mmap(nullptr, *over, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  const auto raw = reinterpret_cast<std::uintptr_t>(p);
  const std::uint64_t base = (raw + chunk_bytes_ - 1) / chunk_bytes_ * chunk_bytes_;
  if (base > raw) munmap(p, base - raw);
  const std::uint64_t tail = raw + *over - (base + size);
  if (tail > 0) munmap(as_ptr(base + size), tail);
  ranges_.emplace(base, size);
  *out = VirtualRange{base, size};
  return true;
}

void HostMemory::free_range(const VirtualRange& range) {
  const auto it = ranges_.find(range.base);
  if (it == ranges_.end() || it->second != range.bytes)
    fail("range.base = {:#x}, range.bytes = {}: not a reserved range (freed twice?)", range.base, range.bytes);
  for (const auto& [addr, slot] : mapped_)
    if (addr >= range.base && addr - range.base < range.bytes)
      fail("range.base = {:#x}: chunk {} is still mapped at {:#x}", range.base, slot, addr);
  if (munmap(as_ptr(range.base), range.bytes) != 0)
    fail("range.base = {:#x}: munmap: {}", range.base, std::strerror(errno));
  ranges_.erase(it);
}

bool HostMemory::create_chunk(ChunkHandle* out) {
  if (max_chunks_ != 0 && live_chunks_ >= max_chunks_) return false;
  std::uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (file_chunks_ >= kDead) return false;  // offset indices are 32-bit
    const auto size = try_mul(file_chunks_ + 1, chunk_bytes_);
    if (!size || *size > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) return false;
    slot = static_cast<std::uint32_t>(file_chunks_);
    if (ftruncate(fd_, static_cast<off_t>(*size)) != 0) return false;
    map_count_.push_back(kDead);
    ++file_chunks_;
  }
  map_count_[slot] = 0;
  ++live_chunks_;
  *out = slot;
  return true;
}

void HostMemory::check_chunk(ChunkHandle chunk, const char* what) const {
  if (chunk >= map_count_.size() || map_count_[chunk] == kDead)
    fail("chunk = {}: {} of a chunk that is not live", chunk, what);
}

void HostMemory::check_run(std::uint64_t addr, std::uint64_t bytes) const {
  if (addr % chunk_bytes_ != 0 || bytes % chunk_bytes_ != 0 || bytes == 0)
    fail("addr = {:#x}, bytes = {}: not a run of whole chunks (chunk size {})", addr, bytes, chunk_bytes_);
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin() || (--it, addr - it->first >= it->second) || bytes > it->second - (addr - it->first))
    fail("addr = {:#x}, bytes = {}: not inside a reserved range", addr, bytes);
}

void HostMemory::release_chunk(ChunkHandle chunk) {
  check_chunk(chunk, "release");
  if (map_count_[chunk] != 0) fail("chunk = {}: still mapped {} times", chunk, map_count_[chunk]);
  // Give the pages back to the OS; the offset stays in the file for reuse.
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(chunk * chunk_bytes_),
                static_cast<off_t>(chunk_bytes_)) != 0)
    fail("chunk = {}: fallocate(PUNCH_HOLE): {}", chunk, std::strerror(errno));
  map_count_[chunk] = kDead;
  free_slots_.push_back(static_cast<std::uint32_t>(chunk));
  --live_chunks_;
}

bool HostMemory::map(ChunkHandle chunk, std::uint64_t addr) {
  check_chunk(chunk, "map");
  check_run(addr, chunk_bytes_);
  if (mapped_.count(addr) != 0) fail("addr = {:#x}: a chunk is already mapped there", addr);
  void* p = mmap(as_ptr(addr), chunk_bytes_, PROT_NONE, MAP_SHARED | MAP_FIXED, fd_,
                 static_cast<off_t>(chunk * chunk_bytes_));
  if (p == MAP_FAILED) return false;
  mapped_.emplace(addr, static_cast<std::uint32_t>(chunk));
  ++map_count_[chunk];
  ++live_mappings_;
  return true;
}

bool HostMemory::set_access(std::uint64_t addr, std::uint64_t bytes) {
  check_run(addr, bytes);
  // mprotect of an unmapped part of the reservation would turn it into plain anonymous
  // memory that no chunk backs.
  for (std::uint64_t a = addr; a - addr < bytes; a += chunk_bytes_)
    if (mapped_.count(a) == 0) fail("addr = {:#x}: no chunk is mapped there", a);
  return mprotect(as_ptr(addr), bytes, PROT_READ | PROT_WRITE) == 0;
}

void HostMemory::unmap(std::uint64_t addr, std::uint64_t bytes) {
  check_run(addr, bytes);
  for (std::uint64_t a = addr; a - addr < bytes; a += chunk_bytes_)
    if (mapped_.count(a) == 0) fail("addr = {:#x}: no chunk is mapped there", a);
  void* p = mmap(as_ptr(addr), bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) fail("addr = {:#x}: mmap(PROT_NONE): {}", addr, std::strerror(errno));
  for (std::uint64_t a = addr; a - addr < bytes; a += chunk_bytes_) {
    auto it = mapped_.find(a);
    --map_count_[it->second];
    mapped_.erase(it);
    --live_mappings_;
  }
}

std::uint32_t HostMemory::map_count(ChunkHandle chunk) const {
  check_chunk(chunk, "map_count");
  return map_count_[chunk];
}

void HostMemory::check_invariants() const {
  std::uint64_t maps = 0;
  std::uint32_t live = 0;
  for (std::uint32_t count : map_count_)
    if (count != kDead) ++live, maps += count;
  for (std::uint32_t slot : free_slots_)
    if (slot >= map_count_.size() || map_count_[slot] != kDead) fail("host memory: free offset {} is live", slot);
  if (live != live_chunks_ || live + free_slots_.size() != file_chunks_)
    fail("host memory: {} live chunks, counter {}, {} free offsets of {}", live, live_chunks_, free_slots_.size(),
         file_chunks_);
  if (maps != live_mappings_ || mapped_.size() != live_mappings_)
    fail("host memory: {} mappings counted per chunk, {} by address, counter {}", maps, mapped_.size(), live_mappings_);
  for (const auto& [addr, slot] : mapped_) {
    check_run(addr, chunk_bytes_);
    if (map_count_[slot] == kDead) fail("host memory: dead chunk {} is mapped at {:#x}", slot, addr);
  }
}

}  // namespace kvmm
