#include "kvmm/distributed/detail/batch_ring.hpp"

#include "kvmm/error.hpp"

#include <bit>
#include <cstring>
#include <type_traits>

namespace kvmm {

namespace {

static_assert(std::is_trivially_copyable_v<KvEvent> && std::is_trivially_copyable_v<BlockHash> &&
              std::is_trivially_copyable_v<KvEventItemKey>);

// Record: [bytes, seq, ts, events, hashes, tokens, text, items] as 8-byte words, then the
// arrays, each padded to 8 bytes. bytes = 0 marks the unused end of the ring (wrap).
constexpr std::uint64_t kHeaderWords = 8;
constexpr std::uint64_t kHeaderBytes = kHeaderWords * 8;

constexpr std::uint64_t pad8(std::uint64_t n) { return (n + 7) & ~std::uint64_t{7}; }

template <class T>
std::uint64_t array_bytes(std::size_t n) {
  return pad8(n * sizeof(T));
}

void put_word(std::byte* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
std::uint64_t get_word(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

template <class T>
std::byte* put_array(std::byte* p, const T* src, std::size_t n) {
  if (n != 0) std::memcpy(p, src, n * sizeof(T));
  return p + array_bytes<T>(n);
}

template <class Vec>
const std::byte* get_array(const std::byte* p, Vec& out, std::uint64_t n) {
  using T = typename Vec::value_type;
  out.resize(n);
  if (n != 0) std::memcpy(out.data(), p, n * sizeof(T));
  return p + array_bytes<T>(n);
}

}  // namespace

BatchRing::BatchRing(std::uint64_t capacity_bytes, std::uint32_t max_batches)
    : capacity_(pad8(capacity_bytes < 64 ? 64 : capacity_bytes)), max_batches_(max_batches) {
  if (max_batches == 0) fail("BatchRing max_batches = 0: must be at least 1");
  data_.reset(new std::byte[capacity_]);
}

std::uint64_t BatchRing::record_bytes(const KvEventBatch& b) {
  return kHeaderBytes + array_bytes<KvEvent>(b.events.size()) + array_bytes<BlockHash>(b.hashes.size()) +
         array_bytes<std::uint32_t>(b.tokens.size()) + array_bytes<char>(b.text.size()) +
         array_bytes<KvEventItemKey>(b.items.size());
}

bool BatchRing::push(const KvEventBatch& b, std::uint64_t seq, double ts) {
  const std::uint64_t need = record_bytes(b);
  if (need > capacity_) return false;
  const std::uint64_t pushed = pushed_.load(std::memory_order_relaxed);
  if (pushed - popped_.load(std::memory_order_acquire) >= max_batches_) return false;
  std::uint64_t tail = tail_.load(std::memory_order_relaxed);
  const std::uint64_t head = head_.load(std::memory_order_acquire);
  std::uint64_t off = tail % capacity_;
  const std::uint64_t skip = capacity_ - off < need ? capacity_ - off : 0;
  if (tail + skip + need - head > capacity_) return false;
  if (skip != 0) {
    put_word(data_.get() + off, 0);
    tail += skip;
    off = 0;
  }
  std::byte* p = data_.get() + off;
  const std::uint64_t header[kHeaderWords] = {
      need,          seq,           std::bit_cast<std::uint64_t>(ts), b.events.size(), b.hashes.size(), b.tokens.size(),
      b.text.size(), b.items.size()};
  std::memcpy(p, header, kHeaderBytes);
  p += kHeaderBytes;
  p = put_array(p, b.events.data(), b.events.size());
  p = put_array(p, b.hashes.data(), b.hashes.size());
  p = put_array(p, b.tokens.data(), b.tokens.size());
  p = put_array(p, b.text.data(), b.text.size());
  put_array(p, b.items.data(), b.items.size());
  tail_.store(tail + need, std::memory_order_release);
  pushed_.store(pushed + 1, std::memory_order_release);
  return true;
}

bool BatchRing::pop(KvEventBatch& out, std::uint64_t& seq, double& ts) {
  std::uint64_t head = head_.load(std::memory_order_relaxed);
  if (head == tail_.load(std::memory_order_acquire)) return false;
  std::uint64_t off = head % capacity_;
  if (get_word(data_.get() + off) == 0) {  // wrap marker: the record starts at offset 0
    head += capacity_ - off;
    off = 0;
  }
  const std::byte* p = data_.get() + off;
  std::uint64_t header[kHeaderWords];
  std::memcpy(header, p, kHeaderBytes);
  p += kHeaderBytes;
  seq = header[1];
  ts = std::bit_cast<double>(header[2]);
  p = get_array(p, out.events, header[3]);
  p = get_array(p, out.hashes, header[4]);
  p = get_array(p, out.tokens, header[5]);
  p = get_array(p, out.text, header[6]);
  get_array(p, out.items, header[7]);
  head_.store(head + header[0], std::memory_order_release);
  popped_.store(popped_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  return true;
}

}  // namespace kvmm
