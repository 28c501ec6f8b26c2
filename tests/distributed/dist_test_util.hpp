// Helpers of the distributed/ tests: run /usr/bin/python3 scripts of tests/dist, hex dumps, and
// skip when the Python packages a test needs are missing (scripts/deps.sh installs them).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace kvmm::test {

inline const char* kPython = "/usr/bin/python3";

inline std::string dist_script(const char* name) { return std::string(KVMM_DIST_TEST_DIR) + "/" + name; }

// Runs `command` with the shell, returns its stdout; `status` gets the exit status.
inline std::string run_capture(const std::string& command, int& status) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) {
    status = -1;
    return out;
  }
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  status = ::pclose(p);
  return out;
}

// True when /usr/bin/python3 imports every module in `modules` (space-separated).
inline bool python_has(const std::string& modules) {
  int status = 0;
  std::string imports;
  for (std::size_t b = 0, e = 0; b < modules.size(); b = e + 1) {
    e = modules.find(' ', b);
    if (e == std::string::npos) e = modules.size();
    imports += "import " + modules.substr(b, e - b) + ";";
  }
  run_capture(std::string(kPython) + " -c '" + imports + "' 2>/dev/null", status);
  return status == 0;
}

inline void write_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::string hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (const std::uint8_t b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 0xf]);
  }
  return s;
}

}  // namespace kvmm::test
