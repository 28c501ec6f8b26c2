// kvmm demo: the layouts of the preset models (page sizes, LCM large pages), the 2026
// lineup's hybrid and MLA layouts with fp8 caches, and a
// walk-through of the two-level allocator on a vision model: request-aware placement
// keeps each request in its own large pages, so a finished request returns them whole.
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

namespace {

void print_layouts() {
  fmt::print("== Preset layouts (16 tokens per page, bf16)\n\n");
  for (const std::string& name : kvmm::presets::names()) {
    const kvmm::KVLayout l = kvmm::presets::by_name(name, {.vision_embedding = true});
    fmt::print("{}\n{}\n", name, l.describe());
  }
}

// The 2026 lineup's two shapes: a gated-DeltaNet hybrid (Qwen3-Next) and MLA with a DSA
// indexer (DeepSeek-V3.2), in bf16 and with an fp8 KV cache. For the hybrid, the attention
// block vLLM would grow to so that one attention page of a layer matches one layer's state
// page (its HybridAttentionMambaModelConfig, 16-token kernel alignment); kvmm keeps 16.
// Their LCMs (75 and 84 MiB) pass the default 64 MiB limit, so the demo plans under 128 MiB:
// no padding.
void print_lineup() {
  fmt::print(
      "== The 2026 lineup: a Qwen3-Next-like hybrid and a DeepSeek-like MLA + indexer (large pages up to 128 MiB)\n\n");
  for (const char* dtype : {"auto", "fp8"}) {
    kvmm::presets::PresetOptions o;
    o.kv_cache_dtype = dtype;
    o.layout.max_large_page_bytes = std::uint64_t{128} << 20;
    const kvmm::KVLayout q = kvmm::presets::qwen3_next_80b_a3b(o);
    fmt::print("qwen3-next-80b-a3b, kv_cache_dtype {}\n{}", dtype, q.describe());
    const kvmm::LayerGroup& attn = q.group(0);
    const std::uint64_t per_token_layer = attn.bytes_per_token() / attn.num_layers;
    const std::uint64_t state = q.group(1).state_bytes_per_layer;
    const std::uint64_t grown = 16 * ((state + 16 * per_token_layer - 1) / (16 * per_token_layer));
    fmt::print("  one pool of equal pages (vLLM) grows attention blocks to {} tokens; kvmm keeps {}\n\n", grown,
               attn.tokens_per_page);
  }
  for (const char* dtype : {"auto", "fp8_ds_mla"}) {
    kvmm::presets::PresetOptions o;
    o.kv_cache_dtype = dtype;
    o.tokens_per_page = 64;
    o.layout.max_large_page_bytes = std::uint64_t{128} << 20;
    fmt::print("deepseek-v3.2 (64 tokens per page), kv_cache_dtype {}\n{}\n", dtype,
               kvmm::presets::deepseek_v3_2(o).describe());
  }
}

void walk_through(kvmm::Placement placement) {
  using kvmm::GroupId;
  const bool aware = placement == kvmm::Placement::kRequestAware;
  fmt::print("== Allocation walk-through: Llama-3.2-11B-Vision, 400 large pages, {} placement\n\n",
             aware ? "request-aware" : "interleaved (naive)");
  kvmm::PagedKVAllocator kv(kvmm::presets::llama3_2_11b_vision({.vision_embedding = true}),
                            {.num_large_pages = 400, .max_requests = 8, .placement = placement});
  const kvmm::KVLayout& l = kv.layout();
  auto show = [&](const char* what) {
    fmt::print("{}\n  large pages free {:>3}/{}", what, kv.large_pages().num_free(), kv.large_pages().capacity());
    for (GroupId g = 0; g < l.num_groups(); ++g)
      fmt::print(" | {}: {} small in {} large", l.group(g).name, kv.small_pages(g).num_used_small(),
                 kv.small_pages(g).num_large_pages());
    fmt::print("\n");
  };
  auto must = [](bool ok) {
    if (!ok) throw kvmm::Error("demo: out of memory");
  };
  show("start");
  // Two requests, each one image (4 tiles x 1601 tokens) and a short question, admitted
  // together: their image tokens are written 40 at a time, interleaved.
  const kvmm::RequestId a = kv.add_request();
  const kvmm::RequestId b = kv.add_request();
  for (std::uint32_t done = 0; done < 6404; done += 40) {
    const std::uint32_t n = std::min<std::uint32_t>(40, 6404 - done);
    must(kv.append_encoder_tokens(a, n));
    must(kv.append_encoder_tokens(b, n));
  }
  must(kv.append_tokens(a, 43));
  must(kv.append_tokens(b, 50));
  show("A and B: 6404 image tokens each (cross-attention + vision embedding), 43/50 text tokens");
  for (int step = 0; step < 64; ++step) {
    must(kv.append_tokens(a, 1));
    must(kv.append_tokens(b, 1));
  }
  show("64 decode steps of A and B, interleaved");
  fmt::print("  A's first cross-attention pages: {}\n",
             fmt::join(kv.page_tables(1).pages(kv.row(a)).subspan(0, 8), " "));
  fmt::print("  B's first cross-attention pages: {}\n",
             fmt::join(kv.page_tables(1).pages(kv.row(b)).subspan(0, 8), " "));
  fmt::print("  (a cross-attention small page id s lives at arena byte s * {})\n", l.small_page_bytes(1));
  const std::uint32_t before = kv.large_pages().num_free();
  kv.free_request(a);
  show("A finished");
  fmt::print("  -> {} large pages returned to the pool at once\n", kv.large_pages().num_free() - before);
  const kvmm::RequestId c = kv.add_request();
  const bool fits = kv.append_tokens(c, 1000000);
  fmt::print("C asks for 1,000,000 tokens: {}\n", fits ? "granted" : "refused, nothing allocated");
  show("after C's attempt");
  kv.free_request(b);
  kv.free_request(c);
  kv.check_invariants();
  show("all finished");
  fmt::print("\n");
}

}  // namespace

int main() {
  print_layouts();
  print_lineup();
  walk_through(kvmm::Placement::kRequestAware);
  walk_through(kvmm::Placement::kInterleaved);
  return 0;
}
