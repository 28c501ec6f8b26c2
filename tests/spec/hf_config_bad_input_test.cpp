// kvmm::read_hf_config against hostile and random input: every malformed config raises
// kvmm::Error naming the source and the field (with its path) and the reader keeps
// serving; random configs of every family place each layer exactly as a plain
// per-layer reference of the family's rule says.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>
#include "support/error_of.hpp"

using namespace kvmm;

namespace {

using kvmm::test::error_of;

constexpr const char* kGood = R"({"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "hidden_size": 512})";

// The reader still serves a good config, with the same result as before the bad one.
void still_serves(const KVLayout& before) {
  const ModelSpec m = read_hf_config(kGood, "good.json");
  REQUIRE(m.layout.num_groups() == 1);
  CHECK(m.layout.large_page_bytes() == before.large_page_bytes());
  CHECK(m.layers.size() == 4);
}

}  // namespace

TEST_CASE("hf config bad input: errors name the source and the field", "[spec][hf_config][errors]") {
  const KVLayout before = read_hf_config(kGood, "good.json").layout;
  struct Case {
    std::string json;
    std::string expect;
  };
  const std::vector<Case> cases{
      {"{\n \"model_type\": \"llama\",\n \"x\": 1,,\n}", "c.json:3:"},
      {"[1]", "c.json: expected a JSON object"},
      {R"({"model_type": 7})", "field 'model_type': expected a string, got 7"},
      {R"({"model_type": "gpt2"})", "field 'model_type': 'gpt2' is not supported; supported: llama, qwen2"},
      {R"({"model_type": "llama"})", "field 'num_hidden_layers': missing"},
      {R"({"model_type": "llama", "num_hidden_layers": 0})",
       "field 'num_hidden_layers': expected a positive integer, got 0"},
      {R"({"model_type": "llama", "num_hidden_layers": 1048576})",
       "field 'num_hidden_layers': 1048576 is more than 65536"},
      {R"({"model_type": "llama", "num_hidden_layers": 18446744073709551615})", "field 'num_hidden_layers'"},
      {R"({"model_type": "llama", "num_hidden_layers": 2.5})",
       "field 'num_hidden_layers': expected a positive integer"},
      {R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 3,
          "hidden_size": 64})",
       "field 'num_key_value_heads': 3 does not divide num_attention_heads = 8"},
      {R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 6, "hidden_size": 64})",
       "field 'hidden_size': 64 is not a multiple of num_attention_heads = 6"},
      {R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 4294967296})",
       "field 'hidden_size': expected a positive integer"},
      {R"({"model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
          "sliding_window": -1})",
       "field 'sliding_window': expected a positive integer, got -1"},
      {R"({"model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
          "layer_types": ["sliding_attention", "full_attention"]})",
       "field 'sliding_window': missing or null but some layers slide"},
      {R"({"model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
          "sliding_window": 8, "layer_types": ["full_attention"]})",
       "field 'layer_types': expected an array of num_hidden_layers = 2 strings"},
      {R"({"model_type": "qwen2", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
          "use_sliding_window": "yes"})",
       "field 'use_sliding_window': expected true or false"},
      {R"({"model_type": "qwen2", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
          "use_sliding_window": true, "sliding_window": 8})",
       "field 'max_window_layers': missing"},
      {R"({"model_type": "gemma2", "query_pre_attn_scalar": -144})",
       "field 'query_pre_attn_scalar': expected a positive number or null, got -144"},
      {R"({"model_type": "gemma2", "attn_logit_softcapping": "50"})",
       "field 'attn_logit_softcapping': expected a positive number or null"},
      {R"({"model_type": "gemma3", "text_config": 5})", "field 'text_config': missing or not an object"},
      {R"({"model_type": "gemma3", "text_config": {"sliding_window_pattern": 0}})",
       "field 'text_config.sliding_window_pattern': expected a positive integer, got 0"},
      {R"({"model_type": "mllama"})", "field 'text_config': missing or not an object"},
      {R"({"model_type": "mllama", "text_config": {"cross_attention_layers": [3, 3]}})",
       "field 'text_config.cross_attention_layers[1]': layer 3 is listed twice"},
      {R"({"model_type": "mllama", "text_config": {"cross_attention_layers": [-1]}})",
       "field 'text_config.cross_attention_layers[0]': expected a layer index below num_hidden_layers = 40, got -1"},
      {R"({"model_type": "mllama", "text_config": {"num_hidden_layers": 1, "cross_attention_layers": [0]}})",
       "field 'text_config.cross_attention_layers': every layer is a cross-attention layer"},
      {R"({"model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 4, "attn_layer_offset": -1})",
       "field 'attn_layer_offset': expected a non-negative integer, got -1"},
      {R"({"model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 4, "attn_layer_offset": 1,
          "num_attention_heads": 4, "hidden_size": 64, "mamba_expand": 2, "mamba_d_conv": 4})",
       "field 'mamba_d_state': missing"},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    CHECK_THAT(error_of([&] { read_hf_config(c.json, "c.json"); }), Catch::Contains(c.expect));
    CHECK_THAT(error_of([&] { read_hf_config(c.json, "c.json"); }), Catch::StartsWith("c.json"));
    still_serves(before);
  }
  CHECK_THAT(error_of([] { read_hf_config_file("/nonexistent/config.json"); }),
             Catch::Contains("config file = '/nonexistent/config.json': cannot open the file"));
  still_serves(before);
}

TEST_CASE("hf config bad input: options are checked before the config", "[spec][hf_config][errors]") {
  HfConfigOptions o;
  o.tokens_per_page = 0;
  CHECK_THAT(error_of([&] { read_hf_config(kGood, "c", o); }), Catch::Contains("HfConfigOptions.tokens_per_page = 0"));
  o = {};
  o.dtype_bytes = 3;
  CHECK_THAT(error_of([&] { read_hf_config(kGood, "c", o); }), Catch::Contains("HfConfigOptions.dtype_bytes = 3"));
  o = {};
  o.state_dtype_bytes = 3;
  CHECK_THAT(error_of([&] { read_hf_config(kGood, "c", o); }),
             Catch::Contains("HfConfigOptions.state_dtype_bytes = 3"));
  o = {};
  o.mamba_checkpoint_interval = 0;
  CHECK_THAT(error_of([&] { read_hf_config(kGood, "c", o); }),
             Catch::Contains("HfConfigOptions.mamba_checkpoint_interval = 0"));
  // A layout limit the groups cannot meet is the planner's error, passed through.
  o = {};
  o.layout.max_large_page_bytes = 0;
  CHECK_THAT(error_of([&] { read_hf_config(kGood, "c", o); }), Catch::Contains("max_large_page_bytes"));
  still_serves(read_hf_config(kGood, "good.json").layout);
}

namespace {

// A random config of one family and the kind each layer must get (the plain reference
// of the family's rule, written per layer).
struct Generated {
  std::string json;
  std::vector<LayerKind> kinds;
  std::uint32_t window = 0;
};

std::string layer_types_json(const std::vector<LayerKind>& kinds) {
  std::string s;
  for (std::size_t i = 0; i < kinds.size(); ++i)
    s += fmt::format("{}\"{}\"", i ? "," : "",
                     kinds[i] == LayerKind::kSlidingWindow ? "sliding_attention" : "full_attention");
  return "[" + s + "]";
}

Generated generate(std::mt19937_64& rng) {
  const std::uint32_t layers = 1 + static_cast<std::uint32_t>(rng() % 48);
  const std::uint32_t kv = 1u << (rng() % 3), q = kv * (1 + static_cast<std::uint32_t>(rng() % 4));
  const std::string heads =
      fmt::format(R"("num_hidden_layers": {}, "num_attention_heads": {}, "num_key_value_heads": {},
      "head_dim": 64)",
                  layers, q, kv);
  Generated g;
  g.window = 16 * (1 + static_cast<std::uint32_t>(rng() % 64));
  g.kinds.assign(layers, LayerKind::kFullAttention);
  auto slide_if = [&](auto pred) {
    for (std::uint32_t i = 0; i < layers; ++i)
      if (pred(i)) g.kinds[i] = LayerKind::kSlidingWindow;
  };
  switch (rng() % 7) {
    case 0:
      g.json = fmt::format(R"({{"model_type": "llama", {}}})", heads);
      break;
    case 1: {  // mistral: every layer, or layer_types
      const bool types = rng() % 2 == 0;
      if (types)
        slide_if([&](std::uint32_t) { return rng() % 2 == 0; });
      else
        slide_if([](std::uint32_t) { return true; });
      g.json = fmt::format(R"({{"model_type": "mistral", {}, "sliding_window": {}{}}})", heads, g.window,
                           types ? ", \"layer_types\": " + layer_types_json(g.kinds) : "");
      break;
    }
    case 2: {  // qwen2: layers at or past max_window_layers when use_sliding_window
      const bool use = rng() % 2 == 0;
      const std::uint32_t first = static_cast<std::uint32_t>(rng() % (layers + 1));
      if (use) slide_if([&](std::uint32_t i) { return i >= first; });
      g.json = fmt::format(R"({{"model_type": "qwen2", {}, "sliding_window": {}, "use_sliding_window": {},
          "max_window_layers": {}}})",
                           heads, g.window, use, first);
      break;
    }
    case 3:  // gemma2: even layers local
      slide_if([](std::uint32_t i) { return i % 2 == 0; });
      g.json = fmt::format(R"({{"model_type": "gemma2", {}, "sliding_window": {}}})", heads, g.window);
      break;
    case 4: {  // gemma3: every pattern-th layer global
      const std::uint32_t pattern = 1 + static_cast<std::uint32_t>(rng() % 8);
      slide_if([&](std::uint32_t i) { return (i + 1) % pattern != 0; });
      g.json = fmt::format(R"({{"model_type": "gemma3", "text_config": {{{}, "sliding_window": {},
          "sliding_window_pattern": {}}}}})",
                           heads, g.window, pattern);
      break;
    }
    case 5: {  // mllama: a random proper subset of layers cross-attends
      std::string list;
      for (std::uint32_t i = 0; i + 1 < layers; ++i)
        if (rng() % 3 == 0) {
          g.kinds[i] = LayerKind::kCrossAttention;
          list += fmt::format("{}{}", list.empty() ? "" : ",", i);
        }
      g.json = fmt::format(R"({{"model_type": "mllama", "text_config": {{{}, "cross_attention_layers": [{}]}}}})",
                           heads, list);
      break;
    }
    default: {  // jamba: attention at offset within each period, Mamba elsewhere
      const std::uint32_t period = 1 + static_cast<std::uint32_t>(rng() % 9);
      const std::uint32_t offset = static_cast<std::uint32_t>(rng() % period);
      for (std::uint32_t i = 0; i < layers; ++i)
        g.kinds[i] = i % period == offset ? LayerKind::kFullAttention : LayerKind::kMambaState;
      g.json = fmt::format(R"({{"model_type": "jamba", {}, "attn_layer_period": {}, "attn_layer_offset": {},
          "hidden_size": 256, "mamba_expand": 2, "mamba_d_state": 16, "mamba_d_conv": 4}})",
                           heads, period, offset);
    }
  }
  return g;
}

}  // namespace

TEST_CASE("hf config: random configs of every family match the per-layer reference", "[spec][hf_config][random]") {
  std::mt19937_64 rng(20261124);
  for (int iter = 0; iter < 2000; ++iter) {
    const Generated g = generate(rng);
    INFO("iteration " << iter << ": " << g.json);
    HfConfigOptions whole;  // one group per kind (the sliced default is checked below)
    whole.layout.slice_layers = SliceLayers::kOff;
    const ModelSpec m = read_hf_config(g.json, "random.json", whole);
    // By default a dense group may be cut (LayoutOptions::slice_layers): each layer keeps its
    // kind and its slot holds it in the layout's map.
    const ModelSpec cut = read_hf_config(g.json, "random.json");
    validate_layers(cut);
    REQUIRE(cut.layers.size() == g.kinds.size());
    for (std::size_t i = 0; i < g.kinds.size(); ++i) REQUIRE(cut.layout.group(cut.layers[i].group).kind == g.kinds[i]);
    REQUIRE(m.layers.size() == g.kinds.size());
    REQUIRE(m.attention.size() == m.layout.num_groups());
    std::vector<std::uint32_t> seen(m.layout.num_groups(), 0);
    for (std::size_t i = 0; i < g.kinds.size(); ++i) {
      const LayerPlacement p = m.layers[i];
      REQUIRE(p.group < m.layout.num_groups());
      REQUIRE(m.layout.group(p.group).kind == g.kinds[i]);
      REQUIRE(p.index == seen[p.group]++);  // slots in model order, no gaps
    }
    for (GroupId grp = 0; grp < m.layout.num_groups(); ++grp) {
      const LayerGroup& lg = m.layout.group(grp);
      REQUIRE(lg.num_layers == seen[grp]);
      if (grp > 0) REQUIRE(static_cast<int>(m.layout.group(grp - 1).kind) < static_cast<int>(lg.kind));
      const AttentionParams& a = m.attention[grp];
      if (lg.kind == LayerKind::kMambaState) {
        REQUIRE(a.num_q_heads == 0);
        continue;
      }
      REQUIRE(a.head_dim == 64);
      REQUIRE(a.num_kv_heads == lg.kv_heads);
      REQUIRE(a.num_q_heads % a.num_kv_heads == 0);
      REQUIRE(a.sliding_window == (lg.kind == LayerKind::kSlidingWindow ? g.window : 0u));
      REQUIRE(lg.window == a.sliding_window);
    }
  }
}

// ---- Hostile input (issue 29 items 3 and 4): nesting, sizes, types per checked field,
// numbers out of range. Every case raises kvmm::Error naming the source and the field, in
// a message of bounded length made of printable ASCII, and the reader keeps serving.

namespace {

std::string nested(const std::string& open, const std::string& inner, const std::string& close, std::size_t levels) {
  std::string s;
  s.reserve(levels * (open.size() + close.size()) + inner.size());
  for (std::size_t i = 0; i < levels; ++i) s += open;
  s += inner;
  for (std::size_t i = 0; i < levels; ++i) s += close;
  return s;
}

std::string llama_with(const std::string& field, const std::string& value) {
  std::string base = R"({"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 2, "hidden_size": 512)";
  return base + ", \"" + field + "\": " + value + "}";
}

// The error, checked to be short, printable ASCII and to start with the source.
std::string bounded_error(const std::string& json) {
  const std::string e = error_of([&] { read_hf_config(json, "c.json"); });
  CHECK(e.size() < 600);
  CHECK(std::all_of(e.begin(), e.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
  CHECK_THAT(e, Catch::StartsWith("c.json"));
  return e;
}

}  // namespace

TEST_CASE("hf config hostile: deep nesting is refused before parsing, naming the field",
          "[spec][hf_config][errors][hostile]") {
  const KVLayout before = read_hf_config(kGood, "good.json").layout;
  // 100,000 levels in a checked field: the message once dumped the value recursively.
  std::string e = bounded_error(llama_with("num_hidden_layers", nested("[", "1", "]", 100000)));
  CHECK_THAT(e, Catch::Contains("field 'num_hidden_layers[0][0][0]"));
  CHECK_THAT(e, Catch::Contains("nested deeper than 64 levels"));
  still_serves(before);
  // The same in a field the reader never looks at, objects and arrays, and unclosed.
  e = bounded_error(llama_with("quantization_config", nested("{\"a\": ", "1", "}", 100000)));
  CHECK_THAT(e, Catch::Contains("field 'quantization_config.a.a.a"));
  e = bounded_error(llama_with("rope_scaling", nested("[", "", "", 100000)));
  CHECK_THAT(e, Catch::Contains("field 'rope_scaling[0][0]"));
  e = bounded_error(std::string(1000000, '['));
  CHECK_THAT(e, Catch::Contains("nested deeper than 64 levels"));
  e = bounded_error(R"({"model_type": "mllama", "text_config": {"num_hidden_layers": )" +
                    nested("[", "1", "]", 100000) + "}}");
  CHECK_THAT(e, Catch::Contains("field 'text_config.num_hidden_layers[0]"));
  // Brackets inside strings do not count; 64 levels (the top-level object and 63 below)
  // are accepted, 65 are not.
  CHECK_NOTHROW(read_hf_config(llama_with("note", "\"" + std::string(1000, '[') + "\""), "c.json"));
  CHECK_NOTHROW(read_hf_config(llama_with("extra", nested("[", "1", "]", 63)), "c.json"));
  e = bounded_error(llama_with("extra", nested("[", "1", "]", 64)));
  CHECK_THAT(e, Catch::Contains("field 'extra" + nested("", "", "[0]", 63) + "': nested deeper than 64 levels"));
  still_serves(before);
}

TEST_CASE("hf config hostile: messages stay bounded for wide and long values", "[spec][hf_config][errors][hostile]") {
  const KVLayout before = read_hf_config(kGood, "good.json").layout;
  std::string wide = "[1";
  for (int i = 2; i <= 100000; ++i) wide += fmt::format(",{}", i);
  wide += "]";
  CHECK_THAT(
      bounded_error(llama_with("num_hidden_layers", wide)),
      Catch::Contains("field 'num_hidden_layers': expected a positive integer, got an array of 100000 elements"));
  std::string obj = "{";
  for (int i = 0; i < 50000; ++i) obj += fmt::format("{}\"k{}\": {}", i ? "," : "", i, i);
  obj += "}";
  CHECK_THAT(bounded_error(llama_with("num_hidden_layers", obj)),
             Catch::Contains("field 'num_hidden_layers': expected a positive integer, got an object of 50000 keys"));
  const std::string huge = std::string(1000000, 'x');
  std::string e = bounded_error(R"({"model_type": ")" + huge + "\"}");
  CHECK_THAT(e, Catch::Contains("field 'model_type': 'xxxxxxxx"));
  CHECK_THAT(e, Catch::Contains("is not supported; supported: llama, qwen2, qwen3, mistral, ministral, gemma2, "
                                "gemma3, gemma3_text, mllama, jamba"));
  CHECK_THAT(bounded_error(R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": ")" + huge + "\"}"),
             Catch::Contains("field 'use_sliding_window': expected true or false, got \"xxxx"));
  CHECK_THAT(
      bounded_error(R"({"model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 2,
      "hidden_size": 64, "sliding_window": 8, "layer_types": ["full_attention", ")" +
                    huge + "\"]}"),
      Catch::Contains("field 'layer_types[1]': expected \"full_attention\" or \"sliding_attention\", got \"xxx"));
  // A huge key before a syntax error: the path in the message is cut too.
  e = bounded_error("{\"" + huge + "\": [1,, 2]}");
  CHECK_THAT(e, Catch::Contains("malformed JSON"));
  CHECK_THAT(e, Catch::Contains("field 'xxxx"));
  still_serves(before);
}

TEST_CASE("hf config hostile: numbers out of range anywhere in the file", "[spec][hf_config][errors][hostile]") {
  const KVLayout before = read_hf_config(kGood, "good.json").layout;
  struct Case {
    std::string field, value, expect;
  };
  const std::vector<Case> cases{
      // Past double's range, in fields the reader does not read (nlohmann's out_of_range once escaped).
      {"rope_theta", "1e999", "field 'rope_theta': 1e999 is past the range of a double"},
      {"rope_theta", "-1e999", "field 'rope_theta': -1e999 is past the range of a double"},
      {"rope_theta", "1e99999999999999999999999999", "field 'rope_theta': 1e99999999999999999999"},
      {"rope_theta", std::string(400, '9') + ".5", "field 'rope_theta': 99999999999999"},
      {"rope_scaling", R"({"factor": [1, 2, 3e400]})", "field 'rope_scaling.factor[2]': 3e400 is past the range"},
      {"num_hidden_layers", "1e999", "field 'num_hidden_layers': 1e999 is past the range of a double"},
      // JSON has no NaN or infinity: malformed, with the field named.
      {"rope_theta", "NaN", "malformed JSON (field 'rope_theta')"},
      {"rope_theta", "Infinity", "malformed JSON (field 'rope_theta')"},
      {"rope_theta", "-Infinity", "malformed JSON (field 'rope_theta')"},
      {"num_hidden_layers", "nan", "malformed JSON (field 'num_hidden_layers')"},
      // Integers the checked fields refuse: huge, negative, non-integer, past 2^31.
      {"num_hidden_layers", "123456789012345678901234567890", "field 'num_hidden_layers': expected a positive integer"},
      {"num_hidden_layers", "1e3", "field 'num_hidden_layers': expected a positive integer, got 1000.0"},
      {"num_hidden_layers", "4.0", "field 'num_hidden_layers': expected a positive integer, got 4.0"},
      {"num_hidden_layers", "-4", "field 'num_hidden_layers': expected a positive integer, got -4"},
      {"num_hidden_layers", "-0", "field 'num_hidden_layers': expected a positive integer, got 0"},
      {"num_attention_heads", "2147483649", "field 'num_attention_heads': expected a positive integer, got 2147483649"},
      {"num_attention_heads", "-9223372036854775808", "field 'num_attention_heads': expected a positive integer"},
      {"hidden_size", "9223372036854775808", "field 'hidden_size': expected a positive integer"},
      {"hidden_size", "1e-400", "field 'hidden_size': expected a positive integer, got 0.0"},
  };
  for (const Case& c : cases) {
    const std::string json = llama_with(c.field, c.value);
    INFO(json.substr(0, 300));
    CHECK_THAT(bounded_error(json), Catch::Contains(c.expect));
    still_serves(before);
  }
  // Within range: a tiny number underflows to 0 as everywhere in JSON, the largest double is kept.
  CHECK_NOTHROW(read_hf_config(llama_with("rope_theta", "1e-999"), "c.json"));
  CHECK_NOTHROW(read_hf_config(llama_with("rope_theta", "1.7976931348623157e308"), "c.json"));
  CHECK_NOTHROW(read_hf_config(llama_with("rope_theta", "-0.0e-99999999999999999999"), "c.json"));
  const ModelSpec g = read_hf_config(R"({"model_type": "gemma2", "attn_logit_softcapping": 1e308})", "c.json");
  CHECK(g.attention[0].softcap == 1e308);
}

TEST_CASE("hf config hostile: every checked field refuses each wrong type", "[spec][hf_config][errors][hostile]") {
  const KVLayout before = read_hf_config(kGood, "good.json").layout;
  // A base config per family, the fields its reader checks and what each must hold.
  struct Field {
    std::string base, name, path, expect;
  };
  const std::string llama = R"("model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 2, "hidden_size": 512, "head_dim": 64)";
  const std::string qwen = R"("model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 8,
      "hidden_size": 512, "use_sliding_window": true, "sliding_window": 64, "max_window_layers": 2)";
  const std::string gemma = R"("model_type": "gemma2", "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50)";
  const std::string jamba = R"("model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 4,
      "attn_layer_offset": 1, "num_attention_heads": 4, "hidden_size": 64, "mamba_expand": 2, "mamba_d_conv": 4,
      "mamba_d_state": 16)";
  const std::string positive = "expected a positive integer, got ";
  const std::vector<Field> fields{
      {llama, "num_hidden_layers", "num_hidden_layers", positive},
      {llama, "num_attention_heads", "num_attention_heads", positive},
      {llama, "num_key_value_heads", "num_key_value_heads", positive},
      {llama, "head_dim", "head_dim", positive},
      {R"("model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8)", "hidden_size", "hidden_size",
       positive},
      {R"("model_type": "mistral", "num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512)",
       "sliding_window", "sliding_window", positive},
      {qwen, "use_sliding_window", "use_sliding_window", "expected true or false, got "},
      {qwen, "max_window_layers", "max_window_layers", "expected a non-negative integer, got "},
      {qwen, "layer_types", "layer_types", "expected an array of num_hidden_layers = 4 strings"},
      {gemma, "query_pre_attn_scalar", "query_pre_attn_scalar", "expected a positive number or null, got "},
      {gemma, "attn_logit_softcapping", "attn_logit_softcapping", "expected a positive number or null, got "},
      {R"("model_type": "gemma3_text")", "sliding_window_pattern", "sliding_window_pattern", positive},
      {jamba, "attn_layer_period", "attn_layer_period", positive},
      {jamba, "attn_layer_offset", "attn_layer_offset", "expected a non-negative integer, got "},
      {jamba, "mamba_expand", "mamba_expand", positive},
      {jamba, "mamba_d_conv", "mamba_d_conv", positive},
      {jamba, "mamba_d_state", "mamba_d_state", positive},
  };
  // Wrong types, and (for numbers) the kinds of wrong value: each refused naming the field.
  const std::vector<std::string> bad{R"("8")", "true", "[8]", R"({"v": 8})", "8.5", "-1e300", "[[[[[[]]]]]]"};
  for (const Field& f : fields) {
    for (const std::string& v : bad) {
      const bool real = f.expect.find("positive number") != std::string::npos;
      if ((f.name == "use_sliding_window" && v == "true") || (real && v == "8.5")) continue;  // valid values
      const std::string json = "{" + f.base + ", \"" + f.name + "\": " + v + "}";
      INFO(json);
      const std::string e = bounded_error(json);
      CHECK_THAT(e, Catch::Contains("field '" + f.path + "': " + f.expect));
    }
  }
  // mllama's cross_attention_layers and its elements; model_type itself.
  const std::string mllama = R"({"model_type": "mllama", "text_config": {"cross_attention_layers": )";
  for (const char* v : {R"("3")", "3", "null", R"({"a": 3})"})
    CHECK_THAT(bounded_error(mllama + v + "}}"),
               Catch::Contains("field 'text_config.cross_attention_layers': missing or not an array"));
  for (const char* v : {R"("3")", "3.5", "true", "[3]", "-1", "40", "1e999"})
    CHECK_THAT(bounded_error(mllama + "[" + v + "]}}"),
               Catch::Contains("field 'text_config.cross_attention_layers[0]"));
  for (const char* v : {"7", "null", "[\"llama\"]", R"({"a": "llama"})", "true"})
    CHECK_THAT(bounded_error(std::string(R"({"model_type": )") + v + "}"), Catch::Contains("field 'model_type': "));
  // Unknown model types, near misses included, list the supported ones.
  for (const char* v : {"", "LLAMA", "llama ", "gpt2", "qwen2_moe", "gemma", "mamba", "\u0000llama"})
    CHECK_THAT(
        bounded_error(std::string(R"({"model_type": ")") + v + "\"}"),
        Catch::Contains("is not supported; supported: " + fmt::format("{}", fmt::join(hf_config_model_types(), ", "))));
  still_serves(before);
}
