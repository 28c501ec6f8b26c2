// JSON pre-scan of the config reader (src/spec/json_scan.hpp): depth, number range and
// the field path at a byte, in one pass with a bounded frame stack.
#include "json_scan.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <system_error>
#include <vector>

namespace kvmm::json_scan {

std::string printable(std::string_view s, std::size_t max) {
  std::string out;
  const std::size_t n = std::min(s.size(), max);
  out.reserve(n + 24);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > max) out += fmt::format("...({} bytes)", s.size());
  return out;
}

namespace {

constexpr std::size_t kMaxKeyBytes = 64;    // of each key kept for the path
constexpr std::size_t kMaxPathBytes = 256;  // of a rendered path: its start and its end

bool number_char(char c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; }

// Whether a number token that std::from_chars found out of range is too large (rather
// than too small, which JSON readers round to 0): the sign of its decimal magnitude.
// Overflow needs a magnitude above 308, underflow one below -307, so the sign decides.
bool overflows(std::string_view t) {
  std::size_t i = t.empty() || t[0] != '-' ? 0 : 1;
  std::int64_t int_digits = 0, lead = -1;  // lead: position of the first nonzero digit
  std::int64_t pos = 0;
  for (; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i, ++pos, ++int_digits)
    if (lead < 0 && t[i] != '0') lead = pos;
  if (i < t.size() && t[i] == '.')
    for (++i; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i, ++pos)
      if (lead < 0 && t[i] != '0') lead = pos;
  if (lead < 0) return false;  // zero
  std::int64_t exp = 0;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    const bool neg = i < t.size() && t[i] == '-';
    if (i < t.size() && (t[i] == '-' || t[i] == '+')) ++i;
    for (; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i)
      exp = std::min<std::int64_t>(exp * 10 + (t[i] - '0'), 1 << 30);
    if (neg) exp = -exp;
  }
  return int_digits - lead - 1 + exp > 0;
}

class Scanner {
 public:
  explicit Scanner(std::size_t max_depth) : max_depth_(max_depth) {}

  // Scans text[0, end); a problem stops the scan.
  // Long by design (lint): one pass over the text, a case per JSON token kind, as a lexer reads.
  // NOLINTBEGIN(readability-function-cognitive-complexity)
  std::optional<Problem> scan(std::string_view text, std::size_t end) {
    // NOLINTEND(readability-function-cognitive-complexity)
    for (std::size_t i = 0; i < end; ++i) {
      const char c = text[i];
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
          key_ = false;
        }
        if (key_ && frames_.back().key.size() < kMaxKeyBytes) frames_.back().key += c;
        continue;
      }
      switch (c) {
        case '"':
          in_string_ = true;
          key_ = !frames_.empty() && frames_.back().object && expect_key_;
          if (key_) {
            frames_.back().key.clear();
            frames_.back().has_key = true;
            expect_key_ = false;
          }
          break;
        case '{':
        case '[':
          if (frames_.size() >= max_depth_)
            return Problem{i, path(), fmt::format("nested deeper than {} levels", max_depth_)};
          frames_.push_back(Frame{c == '{', false, 0, {}});
          expect_key_ = c == '{';
          break;
        case '}':
        case ']':
          if (!frames_.empty()) frames_.pop_back();
          expect_key_ = false;
          break;
        case ',':
          if (!frames_.empty()) {
            frames_.back().has_key = false;
            ++frames_.back().index;
            expect_key_ = frames_.back().object;
          }
          break;
        default:
          if (c == '-' || (c >= '0' && c <= '9')) {
            std::size_t j = i;
            while (j < end && number_char(text[j])) ++j;
            if (auto p = check_number(text.substr(i, j - i), i)) return p;
            i = j - 1;
          }
      }
    }
    return std::nullopt;
  }

  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.object && f.has_key) {
        // Appended in two steps: GCC 12 at -O3 flags `"." + std::string&&` with a false
        // -Wrestrict (the FetchContent consumer builds kvmm that way).
        if (!p.empty()) p += '.';
        p += printable(f.key, kMaxKeyBytes);
      } else if (!f.object && &f != &frames_.front()) {
        p += fmt::format("[{}]", f.index);
      }
    }
    if (p.size() > kMaxPathBytes) {
      std::string cut = p.substr(0, kMaxPathBytes / 2);
      cut += "...";
      cut.append(p, p.size() - kMaxPathBytes / 2);
      p = std::move(cut);
    }
    return p;
  }

 private:
  struct Frame {
    bool object = false;
    bool has_key = false;
    std::size_t index = 0;  // element index in an array
    std::string key;        // the current key in an object (its first kMaxKeyBytes bytes)
  };

  std::optional<Problem> check_number(std::string_view t, std::size_t at) const {
    double v = 0;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (r.ec == std::errc::result_out_of_range && overflows(t))
      return Problem{at, path(), fmt::format("{} is past the range of a double", printable(t, 32))};
    return std::nullopt;
  }

  std::size_t max_depth_;
  std::vector<Frame> frames_;
  bool in_string_ = false, escape_ = false, key_ = false, expect_key_ = false;
};

}  // namespace

std::optional<Problem> find_problem(std::string_view text, std::size_t max_depth) {
  return Scanner(max_depth).scan(text, text.size());
}

std::string path_at(std::string_view text, std::size_t offset, std::size_t max_depth) {
  Scanner s(max_depth);
  s.scan(text, std::min(offset, text.size()));
  return s.path();
}

}  // namespace kvmm::json_scan
