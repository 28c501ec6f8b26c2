#include "kvmm/distributed/kv_event_encoding.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/distributed/detail/msgpack.hpp"
#include "kvmm/error.hpp"

#include <array>

namespace kvmm {

std::string_view medium_name(Medium medium) {
  switch (medium) {
    case Medium::kDevice:
      return "GPU";
    case Medium::kHost:
      return "CPU";
    case Medium::kRemote:
      return "REMOTE";
  }
  fail("medium = {}: not a Medium (0 device, 1 host, 2 remote)", static_cast<unsigned>(medium));
}

std::string_view event_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention:
      return "full_attention";
    case LayerKind::kSlidingWindow:
      return "sliding_window";
    case LayerKind::kChunkedLocal:
      return "chunked_local_attention";
    case LayerKind::kMambaState:
      return "mamba";
    case LayerKind::kCrossAttention:
    case LayerKind::kVisionEmbedding:
      return {};
  }
  return {};
}

namespace {

bool emitted(const KvEvent& e, const KVLayout& layout) {
  return e.kind == KvEventKind::kCleared || layout.group(e.group).is_decoder();
}

// [begin, begin + count) inside an array of `size`; the error names both fields.
void check_range(std::size_t index, const char* begin_name, std::uint64_t begin, const char* count_name,
                 std::uint64_t count, std::uint64_t size, const char* what) {
  const auto end = try_add(begin, count);
  if (!end || *end > size)
    fail("events[{}].{} = {}, {} = {}: outside the batch's {} {}", index, begin_name, begin, count_name, count, size,
         what);
}

bool valid_kind(KvEventKind k) { return static_cast<unsigned>(k) <= static_cast<unsigned>(KvEventKind::kCleared); }
bool valid_medium(Medium m) { return static_cast<unsigned>(m) <= static_cast<unsigned>(Medium::kRemote); }

}  // namespace

void validate_event_encode_options(const EventEncodeOptions& o) {
  if (o.encoding != EventEncoding::kArray && o.encoding != EventEncoding::kMap)
    fail("EventEncodeOptions.encoding = {}: not an EventEncoding (0 array, 1 map)", static_cast<unsigned>(o.encoding));
  if (o.hash_format != EventHashFormat::kU64 && o.hash_format != EventHashFormat::kBytes)
    fail("EventEncodeOptions.hash_format = {}: not an EventHashFormat (0 u64, 1 bytes)",
         static_cast<unsigned>(o.hash_format));
}

void validate_kv_event_batch(const KvEventBatch& batch, const KVLayout& layout) {
  for (std::size_t i = 0; i < batch.events.size(); ++i) {
    const KvEvent& e = batch.events[i];
    if (!valid_kind(e.kind))
      fail("events[{}].kind = {}: not a KvEventKind (0 stored, 1 removed, 2 cleared)", i,
           static_cast<unsigned>(e.kind));
    if (e.kind == KvEventKind::kCleared) continue;
    if (!valid_medium(e.medium))
      fail("events[{}].medium = {}: not a Medium (0 device, 1 host, 2 remote)", i, static_cast<unsigned>(e.medium));
    if (e.group >= layout.num_groups())
      fail("events[{}].group = {}: the layout has {} groups", i, e.group, layout.num_groups());
    if (e.num_pages == 0) fail("events[{}].num_pages = 0: a run holds at least one page", i);
    check_range(i, "hash_begin", e.hash_begin, "num_pages", e.num_pages, batch.hashes.size(), "hashes");
    if (e.kind != KvEventKind::kStored) continue;
    const std::uint32_t tpp = layout.group(e.group).tokens_per_page;
    if (e.tokens_per_page != tpp)
      fail("events[{}].tokens_per_page = {}: group {} has {} tokens per page", i, e.tokens_per_page, e.group, tpp);
    check_range(i, "token_begin", e.token_begin, "num_pages x tokens_per_page", std::uint64_t{e.num_pages} * tpp,
                batch.tokens.size(), "tokens");
    check_range(i, "salt_begin", e.salt_begin, "salt_size", e.salt_size, batch.text.size(), "text bytes");
    check_range(i, "item_begin", e.item_begin, "num_items", e.num_items, batch.items.size(), "items");
    std::uint32_t last = 0;
    for (std::uint32_t k = 0; k < e.num_items; ++k) {
      const KvEventItemKey& item = batch.items[e.item_begin + k];
      if (item.page_in_run >= e.num_pages || item.page_in_run < last)
        fail("events[{}]: items[{}].page_in_run = {} must be < num_pages = {} and not below the previous item's {}", i,
             e.item_begin + k, item.page_in_run, e.num_pages, last);
      last = item.page_in_run;
    }
  }
}

namespace {

class Encoder {
 public:
  Encoder(const KvEventBatch& batch, const KVLayout& layout, const EventEncodeOptions& options,
          std::vector<std::uint8_t>& out)
      : batch_(batch), layout_(layout), options_(options), w_(out) {}

  void batch(double ts) {
    std::uint64_t n = 0;
    for (const KvEvent& e : batch_.events) n += emitted(e, layout_);
    const bool map = options_.encoding == EventEncoding::kMap;
    map ? w_.map_header(3) : w_.array_header(3);
    key("ts");
    w_.float64(ts);
    key("events");
    w_.array_header(n);
    for (const KvEvent& e : batch_.events) {
      if (!emitted(e, layout_)) continue;
      switch (e.kind) {
        case KvEventKind::kStored:
          stored(e);
          break;
        case KvEventKind::kRemoved:
          removed(e);
          break;
        case KvEventKind::kCleared:
          struct_header("AllBlocksCleared", 0);
          break;
      }
    }
    key("data_parallel_rank");
    w_.uint(options_.data_parallel_rank);
  }

 private:
  bool map() const { return options_.encoding == EventEncoding::kMap; }
  // A map key; nothing in the array encoding, where position names the field.
  void key(std::string_view name) {
    if (map()) w_.str(name);
  }
  // A tagged struct with `fields` fields after the tag: {"type": tag, ...} or [tag, ...].
  void struct_header(std::string_view tag, std::uint64_t fields) {
    map() ? w_.map_header(fields + 1) : w_.array_header(fields + 1);
    key("type");
    w_.str(tag);
  }
  void hash(const BlockHash& h) {
    if (options_.hash_format == EventHashFormat::kU64) return w_.uint(h.lo);
    std::array<std::byte, 16> b{};
    for (int i = 0; i < 8; ++i) {
      b[static_cast<std::size_t>(i)] = static_cast<std::byte>(h.hi >> (56 - 8 * i));
      b[static_cast<std::size_t>(8 + i)] = static_cast<std::byte>(h.lo >> (56 - 8 * i));
    }
    w_.bin(b);
  }
  void hashes(const KvEvent& e) {
    const auto hs = batch_.hashes_of(e);
    w_.array_header(hs.size());
    for (const BlockHash& h : hs) hash(h);
  }
  void removed(const KvEvent& e) {
    struct_header("BlockRemoved", 3);
    key("block_hashes");
    hashes(e);
    key("medium");
    w_.str(medium_name(e.medium));
    key("group_idx");
    w_.uint(e.group);
  }
  void stored(const KvEvent& e);
  void extra_keys(const KvEvent& e);

  const KvEventBatch& batch_;
  const KVLayout& layout_;
  const EventEncodeOptions& options_;
  MsgpackWriter w_;
};

void Encoder::stored(const KvEvent& e) {
  const LayerGroup& g = layout_.group(e.group);
  const bool has_extra = e.num_items != 0 || (e.first_page == 0 && e.salt_size != 0);
  const bool has_window = g.kind == LayerKind::kSlidingWindow;
  // Fields after the tag: 7 without defaults, group_idx and the kind always set; in the
  // map encoding extra_keys is dropped when None, in the array encoding it keeps its
  // position (nil) because group_idx follows; the window is trailing in both.
  const std::uint64_t fields = 9 + (map() ? has_extra : 1) + has_window;
  struct_header("BlockStored", fields);
  key("block_hashes");
  hashes(e);
  key("parent_block_hash");
  e.has_parent ? hash(e.parent) : w_.nil();
  key("token_ids");
  w_.uint_array(batch_.tokens_of(e));
  key("block_size");
  w_.uint(e.tokens_per_page);
  key("lora_id");
  e.lora_id != 0 ? w_.uint(e.lora_id) : w_.nil();
  key("medium");
  w_.str(medium_name(e.medium));
  key("lora_name");
  w_.nil();
  if (has_extra) {
    key("extra_keys");
    extra_keys(e);
  } else if (!map()) {
    w_.nil();
  }
  key("group_idx");
  w_.uint(e.group);
  key("kv_cache_spec_kind");
  w_.str(event_kind_name(g.kind));
  if (has_window) {
    key("kv_cache_spec_sliding_window");
    w_.uint(g.window);
  }
}

// One entry per page: nil, or an array of the page's multimodal items as [item hash as 32
// hex digits, offset of the page's first token relative to the item's first token] and,
// on the request's page 0, the cache salt as a string.
void Encoder::extra_keys(const KvEvent& e) {
  const auto items = batch_.items_of(e);
  const std::string_view salt = e.first_page == 0 ? batch_.salt_of(e) : std::string_view{};
  w_.array_header(e.num_pages);
  std::size_t next = 0;
  for (std::uint32_t p = 0; p < e.num_pages; ++p) {
    std::size_t end = next;
    while (end < items.size() && items[end].page_in_run == p) ++end;
    const bool with_salt = p == 0 && !salt.empty();
    const std::uint64_t n = (end - next) + with_salt;
    if (n == 0) {
      w_.nil();
      continue;
    }
    w_.array_header(n);
    for (; next < end; ++next) {
      static constexpr char kHex[] = "0123456789abcdef";
      std::array<char, 32> hex{};
      const BlockHash& h = items[next].item_hash;
      for (int i = 0; i < 16; ++i) {
        hex[static_cast<std::size_t>(i)] = kHex[(h.hi >> (60 - 4 * i)) & 0xf];
        hex[static_cast<std::size_t>(16 + i)] = kHex[(h.lo >> (60 - 4 * i)) & 0xf];
      }
      w_.array_header(2);
      w_.str(std::string_view(hex.data(), hex.size()));
      w_.integer(items[next].offset);
    }
    if (with_salt) w_.str(salt);
  }
}

}  // namespace

void encode_kv_event_batch(const KvEventBatch& batch, const KVLayout& layout, double ts,
                           const EventEncodeOptions& options, std::vector<std::uint8_t>& out) {
  validate_event_encode_options(options);
  validate_kv_event_batch(batch, layout);
  const std::size_t at = out.size();
  try {
    Encoder(batch, layout, options, out).batch(ts);
  } catch (...) {
    out.resize(at);  // nothing of a failed batch stays
    throw;
  }
}

}  // namespace kvmm
