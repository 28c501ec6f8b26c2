// Testing aid (kvmm/testing/: not part of the engine-facing API; docs/api-stability.md).
// FaultyMemory: a test wrapper around another backend whose Nth acquiring call (reserve,
// create_chunk, map, set_access) fails, by returning false or by raising kvmm::Error, and
// whose Nth releasing call (free_range, release_chunk, unmap) raises, so tests can prove
// that every failure position rolls back completely or degrades as documented. A call
// that fails never reaches the wrapped backend. Each call costs one counter increment.
#pragma once

#include "kvmm/error.hpp"
#include "kvmm/memory/backend.hpp"

#include <cstdint>

namespace kvmm {

// How an injected acquiring failure is reported: the backend contract's resource failure
// (false), or an exception (what a backend does for misuse or a broken driver).
enum class FaultMode : std::uint8_t { kReturnFalse, kThrow };

class FaultyMemory final : public MemoryBackend {
 public:
  explicit FaultyMemory(MemoryBackend& inner) : inner_(inner) {}

  // The `n`th acquiring call from now (1-based) fails as `mode` says; 0 disarms.
  void fail_at(std::uint64_t n, FaultMode mode = FaultMode::kReturnFalse) {
    calls_ = 0;
    fail_at_ = n;
    mode_ = mode;
    fired_ = false;
  }
  // The `n`th releasing call from now (1-based) raises kvmm::Error without releasing
  // anything (a backend breaking the promise that releasing cannot fail); 0 disarms.
  void throw_release_at(std::uint64_t n) {
    release_calls_ = 0;
    throw_release_at_ = n;
    fired_ = false;
  }
  // Acquiring calls since the last fail_at, releasing calls since the last
  // throw_release_at (or construction).
  std::uint64_t calls() const { return calls_; }
  std::uint64_t release_calls() const { return release_calls_; }
  // Whether an armed failure has been delivered.
  bool fired() const { return fired_; }

  const char* name() const override { return "faulty"; }
  std::uint64_t granularity() const override { return inner_.granularity(); }
  std::uint64_t chunk_bytes() const override { return inner_.chunk_bytes(); }

  bool reserve(std::uint64_t bytes, VirtualRange* out) override {
    return !trip("reserve") && inner_.reserve(bytes, out);
  }
  void free_range(const VirtualRange& range) override {
    trip_release("free_range");
    inner_.free_range(range);
  }
  bool create_chunk(ChunkHandle* out) override { return !trip("create_chunk") && inner_.create_chunk(out); }
  void release_chunk(ChunkHandle chunk) override {
    trip_release("release_chunk");
    inner_.release_chunk(chunk);
  }
  bool map(ChunkHandle chunk, std::uint64_t addr) override { return !trip("map") && inner_.map(chunk, addr); }
  bool set_access(std::uint64_t addr, std::uint64_t bytes) override {
    return !trip("set_access") && inner_.set_access(addr, bytes);
  }
  void unmap(std::uint64_t addr, std::uint64_t bytes) override {
    trip_release("unmap");
    inner_.unmap(addr, bytes);
  }

 private:
  // True when this acquiring call must report failure by value; raises in kThrow mode.
  bool trip(const char* call) {
    ++calls_;
    if (fail_at_ == 0 || calls_ != fail_at_) return false;
    fired_ = true;
    if (mode_ == FaultMode::kThrow) fail("faulty backend: injected failure of {} (acquiring call {})", call, calls_);
    return true;
  }
  void trip_release(const char* call) {
    ++release_calls_;
    if (throw_release_at_ == 0 || release_calls_ != throw_release_at_) return;
    fired_ = true;
    fail("faulty backend: injected failure of {} (releasing call {})", call, release_calls_);
  }
  MemoryBackend& inner_;
  std::uint64_t calls_ = 0;
  std::uint64_t fail_at_ = 0;
  std::uint64_t release_calls_ = 0;
  std::uint64_t throw_release_at_ = 0;
  FaultMode mode_ = FaultMode::kReturnFalse;
  bool fired_ = false;
};

}  // namespace kvmm
