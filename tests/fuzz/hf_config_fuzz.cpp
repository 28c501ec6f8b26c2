// libFuzzer target: kvmm::read_hf_config over arbitrary bytes, with the default options
// and with options derived from the input's size. Every input must read into a consistent
// ModelSpec (its layer map passes validate_layers) or
// raise kvmm::Error with a short printable message; another exception, a crash or a
// sanitizer report is a finding. Seeds: the real configs in tests/data.
#include "fuzz/fuzz_check.hpp"
#include "kvmm/error.hpp"
#include "kvmm/spec/hf_config.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

void read_one(std::string_view text, const kvmm::HfConfigOptions& options) {
  try {
    const kvmm::ModelSpec m = kvmm::read_hf_config(text, "fuzz.json", options);
    const std::size_t groups = m.layout.num_groups();
    FUZZ_CHECK(groups >= 1 && m.attention.size() == groups);
    FUZZ_CHECK(!m.layers.empty());
    // The layer map against the layout (own, shared-KV and cache-less layers, second
    // caches): a map read_hf_config returned must pass the published check.
    bool consistent = true;
    try {
      kvmm::validate_layers(m);
    } catch (const kvmm::Error&) {
      consistent = false;
    }
    FUZZ_CHECK(consistent);
  } catch (const kvmm::Error& e) {
    FUZZ_CHECK(kvmm::test::error_message_ok(e.what()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  read_one(text, {});
  kvmm::HfConfigOptions o;
  o.tokens_per_page = 1 + static_cast<std::uint32_t>(size % 97);
  o.dtype_bytes = 1u << (size % 3);
  o.state_dtype_bytes = 1u << ((size / 3) % 3);
  o.mamba_checkpoint_interval = 1 + static_cast<std::uint32_t>(size % 1024);
  read_one(text, o);
  return 0;
}
