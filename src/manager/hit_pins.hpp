// HitPins (private to src/manager/): a lookup's hit adopted into a request's rows at its
// admitting allocate. PrefixLookup finds the pages and writes nothing; this unit adopts
// them through Rows (one more reference each, lazy pins) or, when one left the cache since
// the lookup, gives back what it adopted and says so. Costs O(hit pages), plus O(pages of
// the images) for a request with images.
#pragma once

#include "group.hpp"
#include "prefix_lookup.hpp"
#include "request.hpp"
#include "rows.hpp"

#include <cstdint>
#include <vector>

namespace kvmm::detail {

class HitPins {
 public:
  HitPins(std::vector<Group>& groups, PrefixLookup& lookup, Rows& rows)
      : groups_(groups), lookup_(lookup), rows_(rows) {}

  // Maps the pages a hit of p tokens needs in every group into row s (kNullPage below what
  // a group needs), each page checked to be still cached under its hash. false when one
  // was evicted since the lookup: then nothing is adopted and the rows are as they were.
  // enc_p: the hit encoder-token groups adopt (a tier hit adopts decoder groups' local
  // part p and images up to the whole hit); p when 0.
  bool pin(RequestId handle, Row s, const Request& q, std::uint64_t p, std::uint64_t enc_p = 0);
  // At admission, after pin(): every image of q that some encoder-token group still lacks
  // in row s (rows built) and whose pages every group needing it holds cached is adopted
  // from the cache: an image's pages are keyed by the image alone, so they serve whatever
  // text comes before it. from_cache[k] is set for each image whose needed pages all come
  // from the cache (the engine may skip its encoder). A vision-embedding group does not
  // need the images q's hit consumed.
  void pin_cached_images(Row s, const Request& q, std::vector<std::uint8_t>& from_cache);

 private:
  bool pin_images(Row s, const Request& q, GroupId g, std::uint64_t p);

  std::vector<Group>& groups_;
  PrefixLookup& lookup_;
  Rows& rows_;
};

}  // namespace kvmm::detail
