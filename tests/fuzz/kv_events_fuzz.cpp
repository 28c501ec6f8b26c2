// libFuzzer target: the KV event validator and encoder over batches built from the input
// bytes (kvmm has no event decoder: its consumers are Python, msgpack-python). The bytes
// choose a layout (1-4 groups of any kind) and a batch whose fields are mostly in range
// and sometimes raw (kinds and media outside their enums, ranges past the arrays), plus
// the encoding options. A batch the validator accepts must encode, in both encodings, to
// exactly one complete msgpack value (tests/fuzz/msgpack_walk.hpp) headed by the
// 3-field KVEventBatch; one it refuses must make the encoder raise the same kvmm::Error
// and leave the output untouched.
#include "fuzz/fuzz_check.hpp"
#include "fuzz/msgpack_walk.hpp"
#include "kvmm/distributed/kv_event_encoding.hpp"
#include "kvmm/error.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace {

// Reads the input as a stream of little values; zeros once it is exhausted.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return v;
  }
  std::uint64_t u64() { return std::uint64_t{u32()} << 32 | u32(); }
  // Mostly a value in [0, n], sometimes a raw 32-bit one.
  std::uint32_t up_to(std::uint64_t n) {
    const std::uint8_t sel = u8();
    if (sel >= 250) return u32();
    return static_cast<std::uint32_t>(u8() % (n + 1));
  }
  // Mostly a value below n (an enum's size), sometimes any byte.
  std::uint8_t enum_of(unsigned n) {
    const std::uint8_t sel = u8();
    return sel >= 245 ? u8() : static_cast<std::uint8_t>(sel % n);
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

std::optional<kvmm::KVLayout> make_layout(Bytes& in) {
  std::vector<kvmm::LayerGroup> groups;
  const unsigned n = 1 + in.u8() % 4;
  for (unsigned g = 0; g < n; ++g) {
    const std::uint32_t tpp = 1u << (in.u8() % 6), layers = 1 + in.u8() % 4;
    switch (in.u8() % 5) {
      case 0:
        groups.push_back(kvmm::LayerGroup::full_attention("full", layers, 2, 64, 2, tpp));
        break;
      case 1:
        groups.push_back(kvmm::LayerGroup::sliding_window("swa", layers, 2, 64, 2, tpp, 1 + in.u8()));
        break;
      case 2:
        groups.push_back(kvmm::LayerGroup::chunked_local("chunk", layers, 2, 64, 2, tpp, tpp * 4));
        break;
      case 3:
        groups.push_back(kvmm::LayerGroup::cross_attention("cross", layers, 2, 64, 2, tpp));
        break;
      default:
        groups.push_back(kvmm::LayerGroup::mamba_state("mamba", layers, 4096, 64));
        break;
    }
  }
  try {
    return kvmm::KVLayout::plan(std::move(groups));
  } catch (const kvmm::Error&) {
    return std::nullopt;  // a combination the planner refuses: not the target's subject
  }
}

kvmm::KvEventBatch make_batch(Bytes& in, const kvmm::KVLayout& layout) {
  kvmm::KvEventBatch b;
  b.hashes.resize(in.u8() % 64);
  for (auto& h : b.hashes) h = kvmm::BlockHash{in.u64(), in.u64()};
  b.tokens.resize(in.u8() * 4u);
  for (std::size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = static_cast<std::uint32_t>(i * 2654435761u);
  b.text.assign(in.u8() % 48, 's');
  b.items.resize(in.u8() % 16);
  for (auto& item : b.items) {
    item.page_in_run = in.up_to(3);
    item.item_hash = kvmm::BlockHash{in.u64(), in.u64()};
    item.offset = static_cast<std::int64_t>(in.u64());
  }
  const unsigned n = in.u8() % 12;
  for (unsigned i = 0; i < n; ++i) {
    kvmm::KvEvent e;
    e.kind = static_cast<kvmm::KvEventKind>(in.enum_of(3));
    e.medium = static_cast<kvmm::Medium>(in.enum_of(3));
    e.group = static_cast<kvmm::GroupId>(in.up_to(layout.num_groups()));
    e.hash_begin = in.up_to(b.hashes.size());
    e.num_pages = in.up_to(4);
    e.has_parent = in.u8() % 2 != 0;
    e.parent = kvmm::BlockHash{in.u64(), in.u64()};
    e.first_page = in.u8() % 4 == 0 ? 0 : in.u64();
    const std::uint32_t tpp = e.group < layout.num_groups() ? layout.group(e.group).tokens_per_page : 1;
    e.tokens_per_page = in.u8() < 240 ? tpp : in.u32();
    e.token_begin = in.u8() < 250 ? in.up_to(b.tokens.size()) : in.u64();
    e.lora_id = in.u8() % 2 != 0 ? in.u32() : 0;
    e.salt_begin = in.up_to(b.text.size());
    e.salt_size = in.up_to(b.text.size());
    e.item_begin = in.up_to(b.items.size());
    e.num_items = in.up_to(b.items.size());
    b.events.push_back(e);
  }
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::optional<kvmm::KVLayout> layout = make_layout(in);
  if (!layout) return 0;
  const kvmm::KvEventBatch batch = make_batch(in, *layout);
  kvmm::EventEncodeOptions options;
  options.hash_format = static_cast<kvmm::EventHashFormat>(in.enum_of(2));
  options.data_parallel_rank = in.u32();
  const double ts = static_cast<double>(in.u32()) / 16.0;

  std::optional<std::string> refused;
  try {
    kvmm::validate_kv_event_batch(batch, *layout);
  } catch (const kvmm::Error& e) {
    refused = e.what();
    FUZZ_CHECK(kvmm::test::error_message_ok(*refused));
  }
  const std::vector<std::uint8_t> prefix{0x01, 0x02, 0x03};
  for (const auto encoding : {kvmm::EventEncoding::kArray, kvmm::EventEncoding::kMap}) {
    options.encoding = encoding;
    std::vector<std::uint8_t> out = prefix;
    std::optional<std::string> error;
    try {
      kvmm::encode_kv_event_batch(batch, *layout, ts, options, out);
    } catch (const kvmm::Error& e) {
      error = e.what();
    }
    const bool bad_options =
        options.hash_format != kvmm::EventHashFormat::kU64 && options.hash_format != kvmm::EventHashFormat::kBytes;
    if (refused || bad_options) {
      FUZZ_CHECK(error.has_value());
      FUZZ_CHECK(bad_options || *error == *refused);
      FUZZ_CHECK(out == prefix);
      continue;
    }
    FUZZ_CHECK(!error.has_value());
    FUZZ_CHECK(out.size() > prefix.size() && std::equal(prefix.begin(), prefix.end(), out.begin()));
    const auto body = std::span<const std::uint8_t>(out).subspan(prefix.size());
    FUZZ_CHECK(kvmm::test::msgpack_value_size(body) == body.size());
    FUZZ_CHECK(body[0] == (encoding == kvmm::EventEncoding::kMap ? 0x83 : 0x93));  // ts, events, rank
  }
  return 0;
}
