// Exports (private to src/manager/): what the kernels read of a batch. kv lengths (O(1) per
// request), the CSR and dense exports' rows (O(1) per request), the incremental
// block-table export of several groups (each handle resolved once, then O(1) per row and
// group plus the entries that changed) and the fused decode step (commit, append,
// allocate and that export in one call: what an engine would otherwise make as five
// batch calls).
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class Exports {
 public:
  explicit Exports(ManagerCore& m) : m_(m) {}
  // The rows export_options resolved (the batch's, in order).
  std::span<const Row> export_rows() const;
  Exports(const Exports&) = delete;
  Exports& operator=(const Exports&) = delete;

  std::uint64_t kv_len(RequestId r, GroupId g) const;
  std::uint64_t kv_len_at(Row s, GroupId g) const;
  ExportOptions export_options(GroupId g, std::span<const RequestId> batch, const KernelExportOptions& o) const;
  void check_block_tables(std::size_t batch, std::span<const BlockTableOut> tables, std::uint32_t max_pages) const;
  std::size_t export_incremental(std::span<const RequestId> batch, std::span<const BlockTableOut> tables,
                                 std::uint32_t max_pages, const KernelExportOptions& o);
  std::size_t export_rows_incremental(std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                      const KernelExportOptions& o);
  std::size_t decode_step(std::span<const RequestId> batch, std::span<const std::uint32_t> tokens,
                          std::span<const BlockTableOut> tables, std::uint32_t max_pages, const KernelExportOptions& o);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
