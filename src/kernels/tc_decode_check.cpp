// Argument checks of the tensor-core decode's launchers (kernels/tc_decode.cu), kept out of
// the .cu files so that device code never includes fmt. O(1).
#include "../../kernels/tc_decode_api.hpp"
#include "kvmm/error.hpp"

namespace kvmm::kernels::experimental {

void check_tc_stages(const char* kernel, std::uint32_t stages, std::uint32_t head_dim) {
  if (stages < 2 || stages > 4 || (stages != 2 && head_dim != 128))
    fail("{}: stages = {} with head_dim {}: the ring holds 2 stages, or 3 or 4 at head_dim 128", kernel, stages,
         head_dim);
}

void check_tc_shape(const char* kernel, const TcDecodeShape& shape, std::uint32_t rows, std::uint32_t grid_heads) {
  if (shape.tile_tokens != 0 && shape.tile_tokens != 16)
    fail("{}: shape.tile_tokens = {}: 0 (the default warp tiles) or 16", kernel, shape.tile_tokens);
  const std::uint32_t y = shape.heads_first ? rows : grid_heads;
  if (y > 65535)
    fail("{}: {} = {} with shape.heads_first = {}: the grid's y holds at most 65535", kernel,
         shape.heads_first ? "rows" : "kv heads x head chunks", y, shape.heads_first);
}

void check_tc_probe(const char* kernel, const TcDecodeShape& shape, bool runs) {
  if (shape.probe > 3)
    fail("{}: shape.probe = {}: 0 (the kernel), 1 load-only, 2 math-only or 3 the sector lane map", kernel,
         shape.probe);
  if (shape.probe != 0 && !runs)
    fail(
        "{}: shape.probe = {} runs only at bf16, head_dim 128, 2 stages, tile_tokens 0, groups of at most 8 and "
        "paged caches of 16-token multiples",
        kernel, shape.probe);
}

void check_tc_warp_heads(const char* kernel, const TcDecodeShape& shape, bool runs) {
  if (shape.warp_heads && !runs)
    fail(
        "{}: shape.warp_heads = true runs only the swapped form at 2 stages: groups of at most 8, head_dim 64 or "
        "128, tile_tokens 0, probe 0",
        kernel);
}

std::uint32_t tc_choose_num_splits(std::uint32_t rows, std::uint32_t q_heads, std::uint32_t kv_heads,
                                   std::uint32_t max_kv_len, std::uint32_t num_sms, const TcDecodeShape& shape) {
  if (!shape.warp_heads || kv_heads == 0 || q_heads % kv_heads != 0 || q_heads / kv_heads > 8)
    return choose_num_splits(rows, q_heads, kv_heads, max_kv_len, num_sms);
  // One CTA per 4 kv heads: as many CTAs as a cache of ceil(kv_heads / 4) kv heads with
  // groups of at most 4 (one head chunk) would launch.
  const std::uint32_t chunks = (kv_heads + 3) / 4;
  return choose_num_splits(rows, chunks, chunks, max_kv_len, num_sms);
}

}  // namespace kvmm::kernels::experimental
