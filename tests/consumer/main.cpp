// Links against kvmm as an engine would (installed package, pkg-config, or embedded):
// one allocation round trip, a kvmm::Error caught across the library boundary, and the
// headers' version against the one the build system reported (KVMM_EXPECT_VERSION).
#include <kvmm/error.hpp>
#include <kvmm/paging/kv_allocator.hpp>
#include <kvmm/spec/presets.hpp>
#include <kvmm/version.hpp>

#include <cstdio>
#include <string>
#include <string_view>

static_assert(KVMM_VERSION_MAJOR >= 0 && KVMM_VERSION_MINOR >= 0 && KVMM_VERSION_PATCH >= 0);

int main() {
#ifdef KVMM_EXPECT_VERSION
  if (kvmm::version() != std::string_view(KVMM_EXPECT_VERSION)) {
    std::printf("kvmm consumer: headers say %s, the package %s\n", KVMM_VERSION, KVMM_EXPECT_VERSION);
    return 1;
  }
#endif
  kvmm::PagedKVAllocator kv(kvmm::presets::gemma2_27b(), {.num_large_pages = 16, .max_requests = 4});
  const kvmm::RequestId r = kv.add_request();
  if (!kv.append_tokens(r, 100)) return 1;
  const auto pages = kv.page_tables(0).num_pages(kv.row(r));
  kv.free_request(r);
  kv.check_invariants();
  bool raised = false;
  try {
    (void)kv.num_tokens(r);  // r is freed: misuse raises kvmm::Error
  } catch (const kvmm::Error& e) {
    raised = std::string(e.what()).find("request = " + std::to_string(r)) != std::string::npos;
  }
  std::printf(
      "kvmm %s consumer: large page %llu bytes, %u pages for 100 tokens, %u large pages free, "
      "misuse raised kvmm::Error: %s\n",
      KVMM_VERSION, static_cast<unsigned long long>(kv.layout().large_page_bytes()), pages, kv.large_pages().num_free(),
      raised ? "yes" : "no");
  return kv.large_pages().num_free() == 16 && pages == 7 && raised ? 0 : 1;
}
