// FaultyMemory: a test wrapper around another backend whose Nth acquiring call
// (reserve, create_chunk, map, set_access) fails, so tests can prove that every
// failure position rolls back completely. Releasing calls pass through. Each call
// costs one counter increment on top of the wrapped backend.
#pragma once

#include "kvmm/memory/backend.hpp"

#include <cstdint>

namespace kvmm {

class FaultyMemory final : public MemoryBackend {
 public:
  explicit FaultyMemory(MemoryBackend& inner) : inner_(inner) {}

  // The `n`th acquiring call from now (1-based) fails; 0 disarms.
  void fail_at(std::uint64_t n) {
    calls_ = 0;
    fail_at_ = n;
    fired_ = false;
  }
  // Acquiring calls since the last fail_at (or construction).
  std::uint64_t calls() const { return calls_; }
  // Whether the armed failure has been delivered.
  bool fired() const { return fired_; }

  const char* name() const override { return "faulty"; }
  std::uint64_t granularity() const override { return inner_.granularity(); }
  std::uint64_t chunk_bytes() const override { return inner_.chunk_bytes(); }

  bool reserve(std::uint64_t bytes, VirtualRange* out) override { return !trip() && inner_.reserve(bytes, out); }
  void free_range(const VirtualRange& range) override { inner_.free_range(range); }
  bool create_chunk(ChunkHandle* out) override { return !trip() && inner_.create_chunk(out); }
  void release_chunk(ChunkHandle chunk) override { inner_.release_chunk(chunk); }
  bool map(ChunkHandle chunk, std::uint64_t addr) override { return !trip() && inner_.map(chunk, addr); }
  bool set_access(std::uint64_t addr, std::uint64_t bytes) override { return !trip() && inner_.set_access(addr, bytes); }
  void unmap(std::uint64_t addr, std::uint64_t bytes) override { inner_.unmap(addr, bytes); }

 private:
  bool trip() {
    ++calls_;
    if (fail_at_ != 0 && calls_ == fail_at_) {
      fired_ = true;
      return true;
    }
    return false;
  }
  MemoryBackend& inner_;
  std::uint64_t calls_ = 0;
  std::uint64_t fail_at_ = 0;
  bool fired_ = false;
};

}  // namespace kvmm
