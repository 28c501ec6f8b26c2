// vLLM's KV event wire format: one hand-built batch (a stored run at page 0 with a salt and
// a multimodal item, a stored sliding-window run with a parent, a cross-attention run that
// must not be emitted, a removed run, a clear) encoded in both encodings and both hash
// formats, checked against checked-in bytes, against python3-msgpack's decoding (vLLM's
// field order and names), and validation errors for malformed batches.
#include "dist_test_util.hpp"
#include "event_fixture.hpp"
#include "kvmm/distributed/kv_event_encoding.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace kvmm;
using Catch::Contains;
using kvmm::test::test_batch;
using kvmm::test::test_layout;

namespace {

std::vector<std::uint8_t> encode(EventEncoding e, EventHashFormat h) {
  std::vector<std::uint8_t> out;
  encode_kv_event_batch(test_batch(), test_layout(), 1.5, EventEncodeOptions{e, h, 3}, out);
  return out;
}

std::string python_decode(const std::vector<std::uint8_t>& bytes) {
  const auto dir = std::filesystem::temp_directory_path() / ("kvmm_encoding_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "batch.msgpack").string();
  kvmm::test::write_file(file, bytes);
  int status = 0;
  std::string out = kvmm::test::run_capture(
      std::string(kvmm::test::kPython) + " " + kvmm::test::dist_script("msgpack_check.py") + " " + file, status);
  std::filesystem::remove_all(dir);
  REQUIRE(status == 0);
  return out;
}

// The same batch as Python sees it (vLLM's KVEventBatch and events), written by hand.
const char* kMapDecoded =
    "{'ts': 1.5, 'events': ["
    "{'type': 'BlockStored', 'block_hashes': [17, 18], 'parent_block_hash': None, "
    "'token_ids': [1, 2, 3, 4, 5, 6, 7, 300], 'block_size': 4, 'lora_id': None, 'medium': 'GPU', "
    "'lora_name': None, 'extra_keys': [['s1'], [['0000000000000abc000000000000000f', -2]]], "
    "'group_idx': 0, 'kv_cache_spec_kind': 'full_attention'}, "
    "{'type': 'BlockStored', 'block_hashes': [33], 'parent_block_hash': 153, "
    "'token_ids': [9, 10, 11, 12], 'block_size': 4, 'lora_id': 7, 'medium': 'CPU', 'lora_name': None, "
    "'group_idx': 1, 'kv_cache_spec_kind': 'sliding_window', 'kv_cache_spec_sliding_window': 128}, "
    "{'type': 'BlockRemoved', 'block_hashes': [65, 66], 'medium': 'GPU', 'group_idx': 0}, "
    "{'type': 'AllBlocksCleared'}], 'data_parallel_rank': 3}\n";

const char* kArrayDecoded =
    "[1.5, ["
    "['BlockStored', [17, 18], None, [1, 2, 3, 4, 5, 6, 7, 300], 4, None, 'GPU', None, "
    "[['s1'], [['0000000000000abc000000000000000f', -2]]], 0, 'full_attention'], "
    "['BlockStored', [33], 153, [9, 10, 11, 12], 4, 7, 'CPU', None, None, 1, 'sliding_window', 128], "
    "['BlockRemoved', [65, 66], 'GPU', 0], "
    "['AllBlocksCleared']], 3]\n";

}  // namespace

TEST_CASE("events encoding: both encodings decode to vLLM's schema in python3-msgpack") {
  if (!kvmm::test::python_has("msgpack")) {
    WARN("SKIPPED: /usr/bin/python3 lacks msgpack (apt-get install python3-msgpack)");
    return;
  }
  CHECK(python_decode(encode(EventEncoding::kMap, EventHashFormat::kU64)) == kMapDecoded);
  CHECK(python_decode(encode(EventEncoding::kArray, EventHashFormat::kU64)) == kArrayDecoded);
  const std::string bytes_hash = python_decode(encode(EventEncoding::kMap, EventHashFormat::kBytes));
  CHECK_THAT(bytes_hash, Contains("'block_hashes': [b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\n"
                                  "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x11', "));
  CHECK_THAT(bytes_hash, Contains("'parent_block_hash': b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
                                  "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x99'"));
}

namespace {

std::string golden_hex(const char* name) {
  std::ifstream f(kvmm::test::dist_script("golden/") + name);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

// The golden files were written by python3-msgpack's packb of the structures above (an
// independent encoder, shortest forms), so equal bytes mean byte-identical output.
TEST_CASE("events encoding: bytes equal the checked-in golden batches") {
  const std::string map_hex = golden_hex("batch_map.hex");
  const std::string array_hex = golden_hex("batch_array.hex");
  REQUIRE(!map_hex.empty());
  REQUIRE(!array_hex.empty());
  CHECK(kvmm::test::hex(encode(EventEncoding::kMap, EventHashFormat::kU64)) == map_hex);
  CHECK(kvmm::test::hex(encode(EventEncoding::kArray, EventHashFormat::kU64)) == array_hex);
}

TEST_CASE("events encoding: malformed batches raise errors naming the event") {
  const KVLayout layout = test_layout();
  KvEventBatch b = test_batch();
  CHECK_NOTHROW(validate_kv_event_batch(b, layout));
  b.events[0].group = 3;
  CHECK_THROWS_WITH(validate_kv_event_batch(b, layout), Contains("events[0].group = 3"));
  b = test_batch();
  b.events[3].num_pages = 5;
  CHECK_THROWS_WITH(validate_kv_event_batch(b, layout),
                    Contains("events[3].hash_begin = 4, num_pages = 5: outside the batch's 6 hashes"));
  b = test_batch();
  b.events[0].tokens_per_page = 8;
  CHECK_THROWS_WITH(validate_kv_event_batch(b, layout), Contains("events[0].tokens_per_page = 8"));
  b = test_batch();
  b.tokens.resize(10);
  CHECK_THROWS_WITH(validate_kv_event_batch(b, layout),
                    Contains("events[1].token_begin = 8, num_pages x tokens_per_page = 4"));
  b = test_batch();
  b.items[0].page_in_run = 2;
  CHECK_THROWS_WITH(validate_kv_event_batch(b, layout), Contains("events[0]: items[0].page_in_run = 2"));
  b = test_batch();
  b.events[1].num_pages = 0;
  CHECK_THROWS_WITH(validate_kv_event_batch(b, layout), Contains("events[1].num_pages = 0"));
}
