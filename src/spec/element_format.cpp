// Element formats and kv_cache_dtype names (kvmm/spec/element_format.hpp).
#include "kvmm/spec/element_format.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <array>
#include <utility>

namespace kvmm {

std::string_view to_string(ElementType type) {
  switch (type) {
    case ElementType::kBf16:
      return "bf16";
    case ElementType::kFp16:
      return "fp16";
    case ElementType::kFp32:
      return "fp32";
    case ElementType::kFp8E4M3:
      return "fp8_e4m3";
    case ElementType::kFp8E5M2:
      return "fp8_e5m2";
    case ElementType::kInt8:
      return "int8";
    case ElementType::kInt4:
      return "int4";
    case ElementType::kFp4E2M1:
      return "fp4_e2m1";
    case ElementType::kE8M0:
      return "e8m0";
    case ElementType::kRaw8:
      return "8-bit";
    case ElementType::kRaw16:
      return "16-bit";
    case ElementType::kRaw32:
      return "32-bit";
  }
  return "unknown";
}

std::uint32_t bits_of(ElementType type) {
  switch (type) {
    case ElementType::kFp32:
    case ElementType::kRaw32:
      return 32;
    case ElementType::kBf16:
    case ElementType::kFp16:
    case ElementType::kRaw16:
      return 16;
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2:
    case ElementType::kInt8:
    case ElementType::kE8M0:
    case ElementType::kRaw8:
      return 8;
    case ElementType::kInt4:
    case ElementType::kFp4E2M1:
      return 4;
  }
  return 0;
}

ElementFormat ElementFormat::raw_bytes(std::uint32_t dtype_bytes) {
  switch (dtype_bytes) {
    case 1:
      return of(ElementType::kRaw8);
    case 2:
      return of(ElementType::kRaw16);
    case 4:
      return of(ElementType::kRaw32);
    default:
      fail("dtype_bytes = {}: must be 1, 2 or 4", dtype_bytes);
  }
}

std::uint64_t ElementFormat::data_bytes(std::uint64_t rows, std::uint64_t elems, std::string_view what) const {
  const std::uint64_t bits = checked_mul(checked_mul(rows, elems, what), bits_of(type), what);
  if (bits % 8 != 0)
    fail("{}: {} rows x {} elements of {} bits is not a whole number of bytes", what, rows, elems, bits_of(type));
  return bits / 8;
}

std::uint64_t ElementFormat::scale_bytes(std::uint64_t rows, std::uint64_t elems, std::string_view what) const {
  if (!scale.in_pages()) return 0;
  std::uint64_t per_row = 1;
  if (scale.granularity == ScaleGranularity::kPerBlock) {
    if (scale.block == 0 || elems % scale.block != 0)
      fail("{}: scale block {} does not divide a row of {} elements", what, scale.block, elems);
    per_row = elems / scale.block;
  }
  const std::uint64_t bits = checked_mul(checked_mul(rows, per_row, what), bits_of(scale.type), what);
  return ceil_div(bits, 8);
}

void ElementFormat::validate(std::string_view field, std::uint32_t elems) const {
  if (static_cast<unsigned>(type) > static_cast<unsigned>(ElementType::kRaw32))
    fail("{}.type = {}: not an ElementType", field, static_cast<unsigned>(type));
  if (type == ElementType::kE8M0) fail("{}.type = e8m0: a scale type, not an element type", field);
  if (static_cast<unsigned>(scale.granularity) > static_cast<unsigned>(ScaleGranularity::kPerBlock))
    fail("{}.scale.granularity = {}: not a ScaleGranularity", field, static_cast<unsigned>(scale.granularity));
  if (static_cast<unsigned>(scale.placement) > static_cast<unsigned>(ScalePlacement::kSeparate))
    fail("{}.scale.placement = {}: not a ScalePlacement", field, static_cast<unsigned>(scale.placement));
  if (scale.granularity == ScaleGranularity::kNone) return;
  const ElementType st = scale.type;
  if (st != ElementType::kFp32 && st != ElementType::kFp16 && st != ElementType::kBf16 && st != ElementType::kFp8E4M3 &&
      st != ElementType::kE8M0)
    fail("{}.scale.type = {}: a scale is fp32, fp16, bf16, fp8_e4m3 or e8m0", field, to_string(st));
  if (scale.granularity == ScaleGranularity::kPerBlock) {
    if (scale.block == 0) fail("{}.scale.block = 0: a per-block scale needs block >= 1", field);
    if (elems % scale.block != 0)
      fail("{}.scale.block = {}: does not divide the row of {} elements", field, scale.block, elems);
  }
  if (elems != 0 && (std::uint64_t{elems} * bits_of(type)) % 8 != 0)
    fail("{}: a row of {} elements of {} bits is not a whole number of bytes", field, elems, bits_of(type));
}

std::string ElementFormat::describe() const {
  std::string out(to_string(type));
  switch (scale.granularity) {
    case ScaleGranularity::kNone:
      return out;
    case ScaleGranularity::kPerTensor:
      return out + fmt::format("+{}/tensor", to_string(scale.type));
    case ScaleGranularity::kPerTokenHead:
      out += fmt::format("+{}/token-head", to_string(scale.type));
      break;
    case ScaleGranularity::kPerBlock:
      out += fmt::format("+{}/{}", to_string(scale.type), scale.block);
      break;
  }
  if (scale.placement == ScalePlacement::kSeparate) out += " (separate)";
  return out;
}

namespace {

ElementFormat scaled(ElementType t, ScaleGranularity g, std::uint32_t block, ElementType st) {
  return ElementFormat{t, ScaleLayout{g, block, st, ScalePlacement::kInline}};
}

struct Named {
  std::string_view name;
  ElementFormat format;
};

const std::array<Named, 19>& named_formats() {
  using T = ElementType;
  using G = ScaleGranularity;
  static const std::array<Named, 19> k{{
      {"bf16", ElementFormat::of(T::kBf16)},
      {"bfloat16", ElementFormat::of(T::kBf16)},
      {"fp16", ElementFormat::of(T::kFp16)},
      {"float16", ElementFormat::of(T::kFp16)},
      {"half", ElementFormat::of(T::kFp16)},
      {"fp32", ElementFormat::of(T::kFp32)},
      {"float32", ElementFormat::of(T::kFp32)},
      {"float", ElementFormat::of(T::kFp32)},
      {"fp8", scaled(T::kFp8E4M3, G::kPerTensor, 0, T::kFp32)},
      {"fp8_e4m3", scaled(T::kFp8E4M3, G::kPerTensor, 0, T::kFp32)},
      {"fp8_e5m2", scaled(T::kFp8E5M2, G::kPerTensor, 0, T::kFp32)},
      {"fp8_e4m3_per_token_head", scaled(T::kFp8E4M3, G::kPerTokenHead, 0, T::kFp32)},
      {"fp8_per_token_head", scaled(T::kFp8E4M3, G::kPerTokenHead, 0, T::kFp32)},
      {"int8", scaled(T::kInt8, G::kPerTokenHead, 0, T::kFp32)},
      {"int4", scaled(T::kInt4, G::kPerTokenHead, 0, T::kFp32)},
      // DeepSeek's fp8 MLA layout as vLLM names it: e4m3 + one fp32 scale per 128 elements.
      {"fp8_ds_mla", scaled(T::kFp8E4M3, G::kPerBlock, 128, T::kFp32)},
      {"nvfp4", scaled(T::kFp4E2M1, G::kPerBlock, 16, T::kFp8E4M3)},
      {"mxfp8", scaled(T::kFp8E4M3, G::kPerBlock, 32, T::kE8M0)},
      {"mxfp4", scaled(T::kFp4E2M1, G::kPerBlock, 32, T::kE8M0)},
  }};
  return k;
}

}  // namespace

ElementFormat parse_kv_cache_dtype(std::string_view name, std::string_view field) {
  std::string_view base = name;
  ScalePlacement placement = ScalePlacement::kInline;
  if (const auto colon = name.find(':'); colon != std::string_view::npos) {
    base = name.substr(0, colon);
    const std::string_view where = name.substr(colon + 1);
    if (where == "separate")
      placement = ScalePlacement::kSeparate;
    else if (where != "inline")
      fail("{} = '{}': the placement after ':' must be 'inline' or 'separate'", field, name);
  }
  for (const Named& n : named_formats()) {
    if (n.name != base) continue;
    ElementFormat f = n.format;
    f.scale.placement = placement;
    return f;
  }
  std::string known;
  for (const Named& n : named_formats()) {
    known += known.empty() ? "" : ", ";
    known += n.name;
  }
  fail("{} = '{}': unknown; known: {} (each optionally with ':separate' or ':inline')", field, name, known);
}

}  // namespace kvmm
