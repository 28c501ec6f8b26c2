// KernelExports: the kernels' inputs, each forwarded to the manager's core (exports.hpp
// keeps the logic). The cost of a call is the core's plus one indirection.
#include "kvmm/manager/kernel_exports.hpp"

#include "manager_core.hpp"

namespace kvmm {

const PageTableSet& KernelExports::page_tables(GroupId g) const { return kv_->core_->group(g).table; }
std::uint64_t KernelExports::kv_len(RequestId r, GroupId g) const { return kv_->core_->exports.kv_len(r, g); }
std::size_t KernelExports::export_csr(GroupId g, std::span<const RequestId> batch, std::span<std::int32_t> indptr,
                                      std::span<std::int32_t> indices, std::span<std::int32_t> last_page_len,
                                      const KernelExportOptions& o, std::span<std::int32_t> first_page) const {
  const ExportOptions eo = kv_->core_->exports.export_options(g, batch, o);
  return kv_->core_->group(g).table.export_csr(kv_->core_->exports.export_rows(), indptr, indices, last_page_len, eo,
                                               first_page);
}
std::size_t KernelExports::export_dense_incremental(GroupId g, std::span<const RequestId> batch,
                                                    std::span<std::int32_t> block_table, std::uint32_t max_pages,
                                                    const KernelExportOptions& o) {
  const BlockTableOut t{.group = g, .table = block_table};
  return kv_->core_->exports.export_incremental(batch, {&t, 1}, max_pages, o);
}
std::size_t KernelExports::export_dense_incremental(std::span<const RequestId> batch,
                                                    std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                                    const KernelExportOptions& o) {
  return kv_->core_->exports.export_incremental(batch, tables, max_pages, o);
}
std::size_t KernelExports::decode_step(std::span<const RequestId> batch, std::span<const std::uint32_t> tokens,
                                       std::span<const BlockTableOut> tables, std::uint32_t max_pages,
                                       const KernelExportOptions& o) {
  return kv_->core_->exports.decode_step(batch, tokens, tables, max_pages, o);
}
void KernelExports::export_dense(GroupId g, std::span<const RequestId> batch, std::span<std::int32_t> block_table,
                                 std::uint32_t max_pages, const KernelExportOptions& o) const {
  const ExportOptions eo = kv_->core_->exports.export_options(g, batch, o);
  kv_->core_->group(g).table.export_dense(kv_->core_->exports.export_rows(), block_table, max_pages, eo);
}
Row KernelExports::row(RequestId r) const { return kv_->core_->requests().row(r); }

}  // namespace kvmm
