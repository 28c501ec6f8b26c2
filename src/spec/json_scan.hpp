// Private to src/spec (hf_config.cpp): one linear pass over JSON text before nlohmann
// parses it, for what the parser does not bound by itself: nesting depth (a deep value is
// refused before any tree is built or dumped) and numbers past double's range (nlohmann
// raises out_of_range without a position). It tracks the path of the field at each byte
// (keys joined by '.', array elements as [i]) so that every error, syntax errors included,
// names the field. Syntax errors are left to the parser: the scan follows JSON's string
// rule exactly and never reads past the text. O(bytes), memory O(kMaxHfConfigDepth).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvmm::json_scan {

// `s` as printable ASCII: bytes 0x20-0x7e kept, others as \xNN; at most `max` bytes of
// `s` are rendered, then "...(N bytes)".
std::string printable(std::string_view s, std::size_t max = 64);

// The first nesting past `max_depth` levels or number past double's range in `text`.
struct Problem {
  std::size_t offset = 0;  // byte where it starts
  std::string path;        // the field there ("" at the top level)
  std::string what;        // e.g. "1e999 is past the range of a double"
};
std::optional<Problem> find_problem(std::string_view text, std::size_t max_depth);

// The path of the field being read at byte `offset` (text[0, offset) scanned).
std::string path_at(std::string_view text, std::size_t offset, std::size_t max_depth);

}  // namespace kvmm::json_scan
