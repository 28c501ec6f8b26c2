// cuDNN 9's scaled-dot-product attention with paged K/V over kvmm's page tables (issue 37
// item 3): one cuDNN frontend graph per shape (causal, bottom-right aligned: a chunk's
// query i sits at position kv_len - q_len + i), K/V read through a dense int32 page table
// from a container that is kvmm's page-layer arena itself (CudnnKVLayout::kPageLayer,
// strides of kernels/cudnn_paged.hpp) or a head-major packed copy (kHeadMajor, the layout
// of cuDNN's samples: the nearest one to try when cuDNN refuses kvmm's). Q and O are kvmm's
// packed [rows, q_heads, head_dim] with per-request ragged offsets. Building the graph
// costs cuDNN's heuristics and plan compilation (milliseconds to seconds): build once per
// shape, run per step (one cuDNN launch). Every refusal or failure raises kvmm::Error
// with the stage (validate, operation graph, plans, support, build, execute) and cuDNN's
// message. Needs the cuDNN frontend headers and libcudnn (CMake KVMM_CUDNN, cmake/cudnn.cmake).
#pragma once

#include "cudnn_paged.hpp"
#include "kvmm/kernels/attention.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace kvmm::kernels::experimental {

struct CudnnPrefillShape {
  std::uint32_t batch = 1, q_heads = 0, kv_heads = 0, head_dim = 0, tokens_per_page = 0;
  std::uint32_t max_q_len = 0;      // the graph's S_q: the longest chunk of a run
  std::uint32_t pages_per_seq = 0;  // the dense page table's columns (its row stride)
  std::uint64_t num_pages = 0;      // pages in the K and V containers
  std::uint64_t page_stride = 0;    // bytes between pages (kPageLayer); kHeadMajor: packed
  DType dtype = DType::kBF16;
  CudnnKVLayout layout = CudnnKVLayout::kPageLayer;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
};

// Device pointers of one run.
struct CudnnPrefillArgs {
  const void* q = nullptr;  // [rows, q_heads, head_dim]
  void* o = nullptr;        // likewise
  const void* k = nullptr;  // the K container's page 0 (kPageLayer: arena + the layer's K offset)
  const void* v = nullptr;
  const std::int32_t* page_table = nullptr;  // [batch, pages_per_seq]; ids < num_pages where a key is read
  const std::int32_t* seq_len_q = nullptr;   // [batch] (cudnn_prefill_index)
  const std::int32_t* seq_len_kv = nullptr;  // [batch]
  const std::int32_t* q_offsets = nullptr;   // [batch + 1], elements
};

class CudnnPagedPrefill {
 public:
  explicit CudnnPagedPrefill(const CudnnPrefillShape& shape);
  ~CudnnPagedPrefill();
  CudnnPagedPrefill(const CudnnPagedPrefill&) = delete;
  CudnnPagedPrefill& operator=(const CudnnPagedPrefill&) = delete;
  std::size_t workspace_bytes() const;
  void run(const CudnnPrefillArgs& a, void* workspace, Stream stream) const;
  // The container's dims and strides as handed to cuDNN, for messages.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// cudnnGetVersion() of the loaded library, and CUDNN_VERSION of the headers compiled against.
int cudnn_runtime_version();
int cudnn_header_version();

}  // namespace kvmm::kernels::experimental
