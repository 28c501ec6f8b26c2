// Page descriptors for KV transfer engines (NIXL, Mooncake's transfer engine, UCX): a
// request's pages of one group as coalesced (address, bytes, device) runs over a KVArena
// (consecutive page ids merge into one run, null pages are skipped), the pairing of a
// source's runs with a destination's (split to common lengths), and the layout fingerprint
// two kvmm instances compare before exchanging pages. Runs and pairing are O(pages) into
// reused vectors; the fingerprint is one hash over the layout (microseconds).
#pragma once

#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/spec/kv_layout.hpp"
#include "kvmm/types.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm {

// One contiguous range, as NIXL's nixlBasicDesc {addr, len, devId}.
struct PageRun {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
  std::uint64_t device = 0;  // the caller's device id (a CUDA ordinal; 0 on the host)
  friend bool operator==(const PageRun&, const PageRun&) = default;
};

// One copy of a transfer: `bytes` from src to dst.
struct TransferSpan {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const TransferSpan&, const TransferSpan&) = default;
};

// Appends the runs of `pages` (a page table row of group g: small page ids, kNullPage for
// freed out-of-window pages) to `out`: page p covers [base + p * small_page_bytes(g), +
// small_page_bytes(g)); a page whose id is one more than the previous page's extends its
// run. Returns the number of runs appended. Raises kvmm::Error naming the first page id
// outside the arena (nothing appended).
std::size_t page_runs(const KVArena& arena, GroupId g, std::span<const PageId> pages, std::uint64_t device,
                      std::vector<PageRun>& out);

// Appends to `out` the copies that move the bytes of `src` runs, in order, onto the bytes
// of `dst` runs, in order, each split where either side's run ends. Raises kvmm::Error if
// the two cover different byte counts. Pair rows whose null pages coincide (the same
// request state on both sides) or pass the non-null pages only.
std::size_t pair_runs(std::span<const PageRun> src, std::span<const PageRun> dst, std::vector<TransferSpan>& out);

// A 64-bit fingerprint of everything in a layout that decides what a page's bytes mean:
// per group its kind, layers, KV heads, head size, dtype bytes, tokens per page, window,
// chunk, state and embedding sizes, natural and padded page sizes, a head-major kv_order,
// a storage other than K and V, the rope part, the element formats with their scales and
// the state tensors' shapes and formats (each only where the group sets it, so a plain
// token-major group's fingerprint is the one it had before these were hashed) and every
// layer's K/V (or state) offset; plus a format version. Group names and the large page size are not
// in it (they do not change a small page's bytes). Equal layouts give equal fingerprints
// on every machine (a fixed little-endian serialization hashed with XXH3-64).
std::uint64_t layout_fingerprint(const KVLayout& layout);

}  // namespace kvmm
