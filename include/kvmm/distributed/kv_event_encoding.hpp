// vLLM's KV event wire format for a KvEventBatch: one msgpack `KVEventBatch` (ts, events,
// data_parallel_rank) with BlockStored / BlockRemoved / AllBlocksCleared events, in either
// of the two encodings vLLM has used: positional arrays (before vLLM PR #42892) or maps
// with a "type" tag (since). Each stored run carries its group's index, kind and window.
// Encoder-token groups (cross attention, vision embedding) are keyed by image, not by
// decoder tokens, so their events are not emitted. Encoding is O(pages + tokens); a reused
// output vector makes no heap allocation once grown.
#pragma once

#include "kvmm/manager/kv_events.hpp"
#include "kvmm/spec/kv_layout.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvmm {

enum class EventEncoding : std::uint8_t {
  kArray,  // vLLM before PR #42892: structs as arrays, the tag first, trailing defaults dropped
  kMap,    // vLLM now: structs as maps, "type" first, fields equal to their default dropped
};

// How block hashes go on the wire (vLLM's ExternalBlockHash is int or bytes).
enum class EventHashFormat : std::uint8_t {
  kU64,    // the low 64 bits of kvmm's 128-bit hash as an unsigned int (vLLM's default)
  kBytes,  // all 128 bits as 16 bytes: hi then lo, each big-endian (so the last 8 are kU64's)
};

struct EventEncodeOptions {
  EventEncoding encoding = EventEncoding::kMap;
  EventHashFormat hash_format = EventHashFormat::kU64;
  std::uint32_t data_parallel_rank = 0;
};

// vLLM's `medium` for each kvmm Medium: "GPU", "CPU", "REMOTE"; kvmm::Error for a value
// outside the enum.
std::string_view medium_name(Medium medium);
// vLLM's `kv_cache_spec_kind` for a decoder group kind ("full_attention", "sliding_window",
// "chunked_local_attention", "mamba"); empty for encoder-token kinds (never emitted).
std::string_view event_kind_name(LayerKind kind);

// Raises kvmm::Error naming the field when encoding or hash_format is outside its enum.
void validate_event_encode_options(const EventEncodeOptions& options);

// Raises kvmm::Error naming the first event (and its field) whose kind or medium is outside
// its enum, or whose group, hash, token, salt or item range does not fit the batch or the
// layout. A kind's unused fields are not checked (a clear's group and medium, a removed
// run's tokens, salt and items). O(events + items).
void validate_kv_event_batch(const KvEventBatch& batch, const KVLayout& layout);

// Appends one encoded KVEventBatch to `out`. Validates the options' enums and the batch
// first (as above) and raises kvmm::Error with `out` unchanged: an invalid batch is never
// written, not even in part.
void encode_kv_event_batch(const KvEventBatch& batch, const KVLayout& layout, double ts,
                           const EventEncodeOptions& options, std::vector<std::uint8_t>& out);

}  // namespace kvmm
