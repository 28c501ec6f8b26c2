// ImageRows (private to src/manager/): a request's images in the encoder-token groups:
// each item's page range in the rows, the pages an allocate must place (O(pages of the
// images)), the images a first allocate takes whole from the cache, and at the first
// commit their caching and the release of vision-embedding pages the prefill consumed
// (Jenga §6.2). Dispatches on a group's role (decoder or encoder-token) in one place.
#pragma once

#include "kvmm/manager/kv_cache_manager.hpp"
#include "kvmm/types.hpp"
#include "request.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace kvmm::detail {

class ManagerCore;

class ImageRows {
 public:
  explicit ImageRows(ManagerCore& m) : m_(m) {}
  // Whether every page of image m is cached in every encoder-token group (O(pages of m)).
  bool cached_image(const MultimodalItem& m, std::uint32_t lora) const;
  // Whether r's admission took image `item` whole from the cache (O(1)).
  bool image_from_cache(RequestId r, std::uint32_t item) const;
  ImageRows(const ImageRows&) = delete;
  ImageRows& operator=(const ImageRows&) = delete;

  void build_encoder_rows(Row s, const Request& q);
  std::uint64_t encoder_misses(Row s, const Request& q, GroupId g) const;
  bool pin_cached_images(Row s, Request& q);
  void commit_images(Row s, Request& q, std::uint64_t c);

 private:
  ManagerCore& m_;
};

}  // namespace kvmm::detail
