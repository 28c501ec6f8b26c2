// KernelExports: what a step's attention kernels read of a KVCacheManager, as FlashInfer
// and FlashAttention take it: CSR and dense block tables (int32), the incremental dense
// export that rewrites only what changed, kv lengths, and the fused decode step that
// commits, appends, allocates and exports in one call. A companion over a manager it does
// not own (as TierAdmission): it holds a reference and no state of its own, so an engine
// keeps one beside its manager or makes one per call. Each call costs the manager's work
// plus one indirection; the costs are on the calls below. Single-threaded, as the manager.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/paging/page_table.hpp"
#include "kvmm/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvmm {

class KernelExports {
 public:
  explicit KernelExports(KVCacheManager& kv) : kv_(&kv) {}

  // Kernel inputs of group g for the step's batch (after its allocate calls), as FlashInfer
  // and FlashAttention take them (int32): each row holds the pages of the tokens its request
  // will have computed after the step (kv_len(r, g)), so last_page_len is exact and
  // lookahead pages stay out. O(batch + pages written). kvmm::Error for a stale handle, a
  // request with nothing scheduled or computed, or buffers too small.
  std::size_t export_csr(GroupId g, std::span<const RequestId> batch, std::span<std::int32_t> indptr,
                         std::span<std::int32_t> indices, std::span<std::int32_t> last_page_len,
                         const KernelExportOptions& o = {}, std::span<std::int32_t> first_page = {}) const;
  void export_dense(GroupId g, std::span<const RequestId> batch, std::span<std::int32_t> block_table,
                    std::uint32_t max_pages, const KernelExportOptions& o = {}) const;
  // export_dense into a buffer that holds the manager's previous incremental export of
  // group g (the same buffer, max_pages and options; the first call, and a call with a buffer
  // at another address or other max_pages or options, writes everything): a
  // row whose request row is unchanged since gets only the entries changed since rewritten,
  // O(batch + changed entries) instead of O(batch * max_pages): a decode step writes about
  // one entry per request. Returns the number of entries written.
  std::size_t export_dense_incremental(GroupId g, std::span<const RequestId> batch, std::span<std::int32_t> block_table,
                                       std::uint32_t max_pages, const KernelExportOptions& o = {});
  // export_dense_incremental of each table's group into it, every request's row and kv
  // length resolved once for all groups: O(batch * tables + changed entries). Groups must
  // differ (kvmm::Error naming the repeated one). Returns the entries written in all.
  std::size_t export_dense_incremental(std::span<const RequestId> batch, std::span<const BlockTableOut> tables,
                                       std::uint32_t max_pages, const KernelExportOptions& o = {});
  // A decode step of a running batch in one call, as an engine makes it once the previous
  // step's kernels ran and sampled tokens[i] for batch[i]: exactly the separate calls
  //   commit(r, kv_len(r)) for each r (what each request's last allocate scheduled is now
  //   computed), append_token(batch[i], tokens[i]), allocate(batch[i], 1) in order up to the
  //   first refusal, then, if none was refused, export_dense_incremental(batch, tables, ...).
  // Returns how many requests got their page: batch.size() when the tables were written;
  // fewer: the refused request and those after it are committed and have their token, not
  // their page, and the tables are untouched (preempt, then export the smaller batch). The
  // handles (active, not swapped out, past their first allocate, their token ids there), the
  // tokens' count, the groups and the tables' sizes are checked before anything changes; a
  // row longer than max_pages raises at the export, after the allocations (as the separate
  // calls would). O(batch * groups + changed entries), no heap allocation in steady state.
  std::size_t decode_step(std::span<const RequestId> batch, std::span<const std::uint32_t> tokens,
                          std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                          const KernelExportOptions& o = {});
  // The tokens row r of group g exports: for a decoder group what the request will have
  // computed after this step (computed + the tokens its last allocate scheduled); for an
  // encoder-token group its image tokens (each image starts on a page boundary: the pages
  // before the last image count whole, plus the last image's length). O(1).
  std::uint64_t kv_len(RequestId r, GroupId g) const;
  // The rows of group g, indexed by request row (row(r)), for the batch exports of
  // paging/page_table.hpp.
  const PageTableSet& page_tables(GroupId g) const;
  Row row(RequestId r) const;

 private:
  KVCacheManager* kv_;
};

}  // namespace kvmm
