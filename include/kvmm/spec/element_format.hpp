// ElementFormat: how one cached element is stored, in bits (bf16, fp8 e4m3/e5m2, int8,
// int4, fp4 e2m1), and the optional scales that go with it (per tensor, per token-head, or
// per block of N elements; inline after the data they scale or in a separate region at
// the end of the page). kv_cache_dtype names ("fp8_e4m3", "nvfp4", "mxfp8", ...) parse to
// one. Every size here is O(1) overflow-checked arithmetic; validation raises kvmm::Error
// naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvmm {

enum class ElementType : std::uint8_t {
  kBf16,
  kFp16,
  kFp32,
  kFp8E4M3,
  kFp8E5M2,
  kInt8,
  kInt4,
  kFp4E2M1,  // nvfp4 / mxfp4 elements
  kE8M0,     // a power-of-two scale (MX formats); scales only
  kRaw8,     // an element of dtype_bytes 1, 2 or 4 whose type kvmm is not told
  kRaw16,
  kRaw32,
};

std::string_view to_string(ElementType type);
std::uint32_t bits_of(ElementType type);

enum class ScaleGranularity : std::uint8_t {
  kNone,          // no scales
  kPerTensor,     // one scale per layer's K (or V), held by the engine, not in pages
  kPerTokenHead,  // one scale per token and KV head
  kPerBlock,      // one scale per `block` consecutive elements of a token-head
};

enum class ScalePlacement : std::uint8_t {
  kInline,    // right after the layer's K (or V) data in the page, 16-byte aligned
  kSeparate,  // in one scale region at the end of the small page, after every layer's data
};

struct ScaleLayout {
  ScaleGranularity granularity = ScaleGranularity::kNone;
  std::uint32_t block = 0;  // kPerBlock: elements per scale
  ElementType type = ElementType::kFp32;
  ScalePlacement placement = ScalePlacement::kInline;

  bool in_pages() const {
    return granularity == ScaleGranularity::kPerTokenHead || granularity == ScaleGranularity::kPerBlock;
  }
};

struct ElementFormat {
  ElementType type = ElementType::kBf16;
  ScaleLayout scale = {};

  std::uint32_t bits() const { return bits_of(type); }
  // The unscaled format of `dtype_bytes` (1, 2 or 4) bytes per element: kRaw8/16/32.
  static ElementFormat raw_bytes(std::uint32_t dtype_bytes);
  static ElementFormat of(ElementType type) { return ElementFormat{type, {}}; }

  // Bytes of `rows` rows (token-heads) of `elems` elements: the data, and the scales the
  // page holds (0 without in-page scales). kvmm::Error naming `what` when the data is not a
  // whole number of bytes or a product overflows.
  std::uint64_t data_bytes(std::uint64_t rows, std::uint64_t elems, std::string_view what) const;
  std::uint64_t scale_bytes(std::uint64_t rows, std::uint64_t elems, std::string_view what) const;

  // kvmm::Error naming `field` when the format is not usable for rows of `elems`
  // elements: a scale type on data, a block of 0 or not dividing elems, a sub-byte row.
  void validate(std::string_view field, std::uint32_t elems) const;
  // "bf16", "fp8_e4m3+fp32/token-head", "fp4_e2m1+fp8_e4m3/16 (separate)".
  std::string describe() const;

  friend bool operator==(const ElementFormat& a, const ElementFormat& b) {
    return a.type == b.type && a.scale.granularity == b.scale.granularity && a.scale.block == b.scale.block &&
           a.scale.type == b.scale.type && a.scale.placement == b.scale.placement;
  }
};

// A kv_cache_dtype name as vLLM, SGLang and TensorRT-LLM spell them, optionally followed by
// ":separate" (scales in the page's scale region) or ":inline" (the default):
//   bf16 / bfloat16, fp16 / float16 / half, fp32 / float32 / float: unscaled;
//   fp8 / fp8_e4m3: e4m3 with one fp32 scale per tensor (held by the engine, as vLLM's);
//   fp8_e5m2: e5m2, per-tensor scale;
//   fp8_e4m3_per_token_head (alias fp8_per_token_head): e4m3 + one fp32 scale per token-head;
//   int8, int4: one fp32 scale per token-head (LMDeploy's per-head, per-token quantization);
//   fp8_ds_mla: e4m3, one fp32 scale per 128 elements (vLLM's DeepSeek MLA / indexer cache);
//   nvfp4: e2m1, one e4m3 scale per 16 elements (+ a per-tensor fp32 scale held outside);
//   mxfp8: e4m3, one e8m0 scale per 32 elements; mxfp4: e2m1, one e8m0 per 32.
// kvmm::Error naming `field` and listing the accepted names otherwise.
ElementFormat parse_kv_cache_dtype(std::string_view name, std::string_view field = "kv_cache_dtype");

}  // namespace kvmm
