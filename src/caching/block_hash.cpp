#include "kvmm/caching/block_hash.hpp"

#include "block_hash_detail.hpp"

#include "kvmm/detail/prefetch.hpp"
#include "kvmm/error.hpp"

#include <cstring>

namespace kvmm {

using detail::content_digest;
using detail::kTagItem;
using detail::link;
using detail::to_hash;

BlockHash hash_page(const BlockHash& parent, std::span<const std::uint32_t> tokens, const PageExtraKeys& extra) {
  return link(parent, content_digest(tokens, extra));
}

namespace {

// The source ids (and the copy's lines) are requested 2 KiB (32 16-token pages) ahead:
// a prompt read once is usually not in cache, and the hardware streamer restarts at
// every 4 KiB page.
constexpr std::size_t kPrefetchAhead = 2048;

// The chain over `pages` pages of `bytes` bytes each, their content digests from `src`,
// each hash handed to emit(i, h); kBytes > 0 fixes the length at compile time (16-token
// pages), which lets the compiler fold XXH3's length branches. With a LoRA id the digest
// appends it (content_digest). `dst` (or null) receives a copy of each page's ids. Each
// link's hi loses the bits of `clear` (BlockHasher's salted_only key space; usually 0).
template <std::size_t kBytes, class Emit>
[[gnu::always_inline]] inline void chain(BlockHash h, const std::uint32_t* src, std::uint32_t* dst,
                                         std::uint32_t tokens_per_page, std::uint32_t lora_id, std::size_t pages,
                                         std::uint64_t clear, Emit&& emit) {
  const std::size_t bytes = kBytes > 0 ? kBytes : std::size_t{tokens_per_page} * 4;
  const auto* p = reinterpret_cast<const unsigned char*>(src);
  auto* d = reinterpret_cast<unsigned char*>(dst);
  PageExtraKeys ex;
  ex.lora_id = lora_id;
  // One pass: page i+1's digest does not depend on the chain, so the core computes it
  // while page i's link (the latency-bound part) is in flight.
  for (std::size_t i = 0; i < pages; ++i, p += bytes) {
    if ((i + 1) * bytes + kPrefetchAhead <= pages * bytes) {  // stays inside the arrays
      detail::prefetch_read(p + kPrefetchAhead);
      if (d != nullptr) detail::prefetch_write(d + i * bytes + kPrefetchAhead);
    }
    if (d != nullptr) std::memcpy(d + i * bytes, p, bytes);
    const BlockHash c = lora_id == 0 ? to_hash(detail::xxh128(p, bytes))
                                     : content_digest({src + i * tokens_per_page, tokens_per_page}, ex);
    h = link(h, c);
    h.hi &= ~clear;
    emit(i, h);
  }
}

template <class Emit>
void chain_any(BlockHash h, const std::uint32_t* src, std::uint32_t* dst, std::uint32_t tokens_per_page,
               std::uint32_t lora_id, std::size_t pages, std::uint64_t clear, Emit&& emit) {
  // clear == 0 (every mode but salted_only's unsalted chains) inlined as a constant: the
  // mask leaves the latency-bound chain.
  if (tokens_per_page == 16 && clear == 0)
    chain<64>(h, src, dst, tokens_per_page, lora_id, pages, 0, emit);
  else if (tokens_per_page == 16)
    chain<64>(h, src, dst, tokens_per_page, lora_id, pages, clear, emit);
  else
    chain<0>(h, src, dst, tokens_per_page, lora_id, pages, clear, emit);
}

void check_pages(std::span<const std::uint32_t> tokens, std::uint32_t tokens_per_page, std::size_t pages) {
  if (tokens_per_page == 0 || tokens.size() / tokens_per_page < pages)
    fail("tokens: size {} < {} pages x {} tokens", tokens.size(), pages, tokens_per_page);
}

}  // namespace

void hash_pages(const BlockHash& parent, std::span<const std::uint32_t> tokens, std::uint32_t tokens_per_page,
                std::uint32_t lora_id, std::span<BlockHash> out) {
  check_pages(tokens, tokens_per_page, out.size());
  BlockHash* o = out.data();
  chain_any(parent, tokens.data(), nullptr, tokens_per_page, lora_id, out.size(), 0,
            [o](std::size_t i, const BlockHash& h) { o[i] = h; });
}

namespace detail {

void append_page_hashes(std::vector<BlockHash>& hashes, std::span<const std::uint32_t> tokens,
                        std::uint32_t tokens_per_page, std::uint32_t lora_id, std::size_t pages, std::uint32_t* copy,
                        std::uint64_t clear) {
  check_pages(tokens, tokens_per_page, pages);
  const BlockHash parent = hashes.empty() ? BlockHash{} : hashes.back();
  chain_any(parent, tokens.data(), copy, tokens_per_page, lora_id, pages, clear,
            [&hashes](std::size_t, const BlockHash& h) { hashes.push_back(h); });
}

}  // namespace detail

BlockHash hash_item_page(const BlockHash& item, std::uint32_t page_index, std::uint32_t lora_id) {
  unsigned char buf[8 + 16 + 4 + 4];
  std::memcpy(buf, &kTagItem, 8);
  std::memcpy(buf + 8, &item, 16);
  std::memcpy(buf + 24, &page_index, 4);
  std::memcpy(buf + 28, &lora_id, 4);
  return to_hash(XXH3_128bits(buf, sizeof buf));
}

BlockHash hash_bytes(std::span<const std::byte> bytes) { return to_hash(XXH3_128bits(bytes.data(), bytes.size())); }

}  // namespace kvmm
