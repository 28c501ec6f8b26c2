// BlockHasher (BlockHashOptions): SHA-256 and keyed BLAKE2b keys are libsodium's one-shot
// digests of the encoding block_hasher.hpp documents, built here byte by byte (and one
// value of each computed by Python's hashlib, another implementation); the chain property
// through RequestHashes, the manager's path (a change anywhere before page k, salt, LoRA
// and images included, changes every key from k on, and none before); salted_only keeps
// XXH3-128 for unsalted requests in a disjoint key space; bad key material is refused.
#include "kvmm/caching/block_hasher.hpp"
#include "kvmm/caching/request_hashes.hpp"
#include "kvmm/error.hpp"
#include "support/error_of.hpp"

#include <sodium.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace kvmm;
using kvmm::test::error_of;

namespace {

const std::string kKey = "0123456789abcdef0123456789ABCDEF";  // 32 bytes

BlockHashOptions opts(BlockHashFunction f, bool salted_only = false) {
  BlockHashOptions o;
  o.function = f;
  o.salted_only = salted_only;
  if (f == BlockHashFunction::kBlake2bKeyed) o.key = kKey;
  return o;
}

// The documented encoding, written out.
struct Bytes {
  std::vector<unsigned char> b;
  Bytes& raw(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  template <class T>
  Bytes& put(const T& v) {
    return raw(&v, sizeof v);
  }
};

std::vector<unsigned char> page_encoding(const BlockHash& parent, const std::vector<std::uint32_t>& tokens,
                                         const PageExtraKeys& ex) {
  Bytes m;
  m.raw("kvmm.pg1", 8).put(parent.lo).put(parent.hi).put(static_cast<std::uint32_t>(tokens.size()));
  const std::uint32_t flags = (ex.item ? 1u : 0u) | (ex.lora_id ? 2u : 0u) | (ex.salt.empty() ? 0u : 4u);
  m.put(flags).raw(tokens.data(), tokens.size() * 4);
  if (ex.item) m.put(ex.item->hash.lo).put(ex.item->hash.hi).put(ex.item_offset);
  if (ex.lora_id) m.put(ex.lora_id);
  if (!ex.salt.empty()) m.put(std::uint64_t{ex.salt.size()}).raw(ex.salt.data(), ex.salt.size());
  return m.b;
}

// libsodium's one-shot calls, first 16 bytes.
BlockHash first16(const unsigned char* out) {
  BlockHash h;
  std::memcpy(&h.lo, out, 8);
  std::memcpy(&h.hi, out + 8, 8);
  return h;
}
BlockHash sha256_of(const std::vector<unsigned char>& m) {
  unsigned char out[32];
  crypto_hash_sha256(out, m.data(), m.size());
  return first16(out);
}
BlockHash blake2b_of(const std::vector<unsigned char>& m) {
  unsigned char out[16];
  crypto_generichash_blake2b(out, 16, m.data(), m.size(), reinterpret_cast<const unsigned char*>(kKey.data()),
                             kKey.size());
  return first16(out);
}

std::string hex(const unsigned char* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", p[i]);
  return s;
}

}  // namespace

TEST_CASE("the libraries' one-shot calls are SHA-256 and keyed BLAKE2b (published vectors)", "[caching][hasher]") {
  REQUIRE(sodium_init() >= 0);
  // FIPS 180-2, appendix B.1: SHA-256("abc").
  unsigned char out[64];
  crypto_hash_sha256(out, reinterpret_cast<const unsigned char*>("abc"), 3);
  CHECK(hex(out, 32) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // BLAKE2 reference KAT (blake2b-kat.txt, keyed): empty input, key 00..3f, 64-byte output.
  unsigned char key[64];
  for (int i = 0; i < 64; ++i) key[i] = static_cast<unsigned char>(i);
  crypto_generichash_blake2b(out, 64, nullptr, 0, key, 64);
  CHECK(
      hex(out, 64) ==
      "10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786b5e996e8f0f4eb981fc214b005f42d2ff4233499391653d"
      "f7aefcbc13fc51568");
}

TEST_CASE("SHA-256 and keyed BLAKE2b keys are the library's digest of the documented encoding", "[caching][hasher]") {
  const BlockHasher sha(opts(BlockHashFunction::kSha256));
  const BlockHasher b2(opts(BlockHashFunction::kBlake2bKeyed));
  std::vector<std::uint32_t> tokens(16);
  for (std::uint32_t i = 0; i < 16; ++i) tokens[i] = 1000 + i;
  const BlockHash parent{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  const MultimodalItem img{BlockHash{11, 22}, 5, 30};
  for (int variant = 0; variant < 8; ++variant) {
    INFO("variant " << variant);
    PageExtraKeys ex;
    if (variant & 1) {
      ex.item = &img;
      ex.item_offset = ~std::uint64_t{0} - 4;  // the item starts inside the page
    }
    if (variant & 2) ex.lora_id = 7;
    if (variant & 4) ex.salt = "tenant-a";
    const auto m = page_encoding(parent, tokens, ex);
    CHECK(sha.hash_page(true, parent, tokens, ex) == sha256_of(m));
    CHECK(b2.hash_page(true, parent, tokens, ex) == blake2b_of(m));
    CHECK_FALSE(sha.hash_page(true, parent, tokens, ex) == hash_page(parent, tokens, ex));
  }
  // An empty page (a further item of a page) and a long one (past any stack buffer).
  PageExtraKeys more;
  more.item = &img;
  CHECK(sha.hash_page(true, parent, {}, more) == sha256_of(page_encoding(parent, {}, more)));
  const std::vector<std::uint32_t> long_page(4096, 3);
  CHECK(b2.hash_page(true, parent, long_page, {}) == blake2b_of(page_encoding(parent, long_page, {})));

  Bytes item;
  item.raw("kvmm.it1", 8).put(img.hash.lo).put(img.hash.hi).put(std::uint32_t{3}).put(std::uint32_t{7});
  CHECK(sha.hash_item_page(img.hash, 3, 7) == sha256_of(item.b));
  CHECK(b2.hash_item_page(img.hash, 3, 7) == blake2b_of(item.b));
  Bytes bytes;
  bytes.raw("kvmm.by1", 8).raw("pixels", 6);
  CHECK(sha.hash_bytes(std::as_bytes(std::span("pixels", 6))) == sha256_of(bytes.b));
  CHECK(b2.hash_bytes(std::as_bytes(std::span("pixels", 6))) == blake2b_of(bytes.b));

  // The same page computed by Python's hashlib (another implementation of both):
  //   m = b"kvmm.pg1" + bytes(16) + struct.pack("<II", 16, 0) + struct.pack("<16I", *range(1000, 1016))
  //   hashlib.sha256(m).hexdigest()[:32]; hashlib.blake2b(m, digest_size=16, key=KEY).hexdigest()
  unsigned char out[16];
  const BlockHash s = sha.hash_page(false, {}, tokens, {});
  std::memcpy(out, &s.lo, 8);
  std::memcpy(out + 8, &s.hi, 8);
  CHECK(hex(out, 16) == "33d34c173311ffdfe30a59d3e9956bbb");
  const BlockHash k = b2.hash_page(false, {}, tokens, {});
  std::memcpy(out, &k.lo, 8);
  std::memcpy(out + 8, &k.hi, 8);
  CHECK(hex(out, 16) == "2f501debf395889b72273818e6a00f9e");
}

TEST_CASE("hash_pages equals the hash_page chain in every mode", "[caching][hasher]") {
  std::vector<std::uint32_t> tokens(16 * 5);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i * 7);
  for (const BlockHashFunction f :
       {BlockHashFunction::kXxh3_128, BlockHashFunction::kSha256, BlockHashFunction::kBlake2bKeyed}) {
    for (const bool salted_only : {false, true}) {
      for (const bool salted : {false, true}) {
        const BlockHasher h(opts(f, salted_only));
        std::vector<BlockHash> out(5), expect;
        h.hash_pages(salted, {}, tokens, 16, 3, out);
        PageExtraKeys ex;
        ex.lora_id = 3;
        for (std::size_t i = 0; i < 5; ++i)
          expect.push_back(h.hash_page(salted, i ? expect.back() : BlockHash{},
                                       std::span<const std::uint32_t>(tokens).subspan(i * 16, 16), ex));
        CHECK(out == expect);
        std::vector<BlockHash> six(6);
        CHECK_THROWS_AS(h.hash_pages(salted, {}, tokens, 16, 3, six), Error);
      }
    }
  }
}

namespace {

struct Prompt {
  std::vector<std::uint32_t> tokens;
  std::uint32_t lora = 0;
  std::string salt;
  std::vector<MultimodalItem> items;
};

// The chain RequestHashes (the manager's path) computes for one page size.
std::vector<BlockHash> chain_of(const Prompt& p, const BlockHasher& h, std::uint32_t P) {
  RequestHashes r;
  const std::uint32_t cls[1] = {P};
  r.assign(p.tokens, p.lora, p.salt, p.items, cls, true, false, 0, h);
  const auto c = r.chain(0);
  return {c.begin(), c.end()};
}

// Every key from `from` on differs from the base chain, none before.
void check_diverges_at(const std::vector<BlockHash>& base, const std::vector<BlockHash>& other, std::size_t from) {
  REQUIRE(base.size() == other.size());
  for (std::size_t i = 0; i < base.size(); ++i) {
    INFO("page " << i << " (change at page " << from << ")");
    CHECK((base[i] == other[i]) == (i < from));
  }
}

}  // namespace

TEST_CASE("a change before page k changes every key from k on, in every mode", "[caching][hasher]") {
  std::mt19937_64 rng(11);
  for (const BlockHashFunction f :
       {BlockHashFunction::kXxh3_128, BlockHashFunction::kSha256, BlockHashFunction::kBlake2bKeyed}) {
    for (const bool salted_only : {false, true}) {
      const BlockHasher h(opts(f, salted_only));
      for (const std::uint32_t P : {4u, 16u}) {
        INFO(to_string(f) << " salted_only " << salted_only << " P " << P);
        Prompt base;
        base.tokens.resize(P * 8);
        for (auto& t : base.tokens) t = static_cast<std::uint32_t>(rng() % 50000);
        base.lora = 2;
        base.salt = "tenant-a";
        base.items = {MultimodalItem{BlockHash{1, 2}, P * 3 + 1, P}};  // pages 3 and 4
        const auto b = chain_of(base, h, P);
        REQUIRE(b.size() == 8);
        for (std::size_t k = 0; k < 8; ++k) {  // a token of page k
          Prompt q = base;
          q.tokens[k * P + rng() % P] ^= 1;
          check_diverges_at(b, chain_of(q, h, P), k);
        }
        Prompt q = base;
        q.salt = "tenant-b";
        check_diverges_at(b, chain_of(q, h, P), 0);
        q = base;
        q.salt.clear();
        check_diverges_at(b, chain_of(q, h, P), 0);
        q = base;
        q.lora = 3;
        check_diverges_at(b, chain_of(q, h, P), 0);
        q = base;
        q.items[0].hash.hi ^= 1;  // another image
        check_diverges_at(b, chain_of(q, h, P), 3);
        q = base;
        q.items[0].offset += 1;  // the same image one token later
        check_diverges_at(b, chain_of(q, h, P), 3);
        // The chain equals the hasher's own page-by-page chain.
        std::vector<BlockHash> expect;
        for (std::size_t i = 0; i < 8; ++i) {
          PageExtraKeys ex;
          ex.lora_id = base.lora;
          if (i == 0) ex.salt = base.salt;
          const MultimodalItem& m = base.items[0];
          if (m.offset < (i + 1) * P && m.offset + m.length > i * P) {
            ex.item = &m;
            ex.item_offset = i * P - m.offset;
          }
          expect.push_back(h.hash_page(true, i ? expect.back() : BlockHash{},
                                       std::span<const std::uint32_t>(base.tokens).subspan(i * P, P), ex));
        }
        CHECK(b == expect);
      }
    }
  }
}

TEST_CASE("salted_only: unsalted requests keep XXH3-128 with bit 63 clear, salted ones the function with it set",
          "[caching][hasher]") {
  for (const BlockHashFunction f : {BlockHashFunction::kSha256, BlockHashFunction::kBlake2bKeyed}) {
    INFO(to_string(f));
    const BlockHasher h(opts(f, true));
    CHECK(h.function_for(false) == BlockHashFunction::kXxh3_128);
    CHECK(h.function_for(true) == f);
    Prompt p;
    p.tokens.resize(16 * 6);
    for (std::size_t i = 0; i < p.tokens.size(); ++i) p.tokens[i] = static_cast<std::uint32_t>(i * 31 + 5);
    // Unsalted: XXH3-128's chain (block_hash.hpp), each key with bit 63 of hi cleared.
    std::vector<BlockHash> xxh3;
    for (std::size_t i = 0; i < 6; ++i) {
      BlockHash k = hash_page(i ? xxh3.back() : BlockHash{}, std::span(p.tokens).subspan(i * 16, 16), {});
      k.hi &= ~BlockHasher::kSaltedBit;
      xxh3.push_back(k);
    }
    CHECK(chain_of(p, h, 16) == xxh3);
    // Salted: the function's keys, bit 63 set.
    p.salt = "t";
    const auto salted = chain_of(p, h, 16);
    const BlockHasher all(opts(f, false));
    PageExtraKeys ex0;
    ex0.salt = "t";
    BlockHash k0 = all.hash_page(true, {}, std::span(p.tokens).subspan(0, 16), ex0);
    k0.hi |= BlockHasher::kSaltedBit;
    CHECK(salted[0] == k0);
    for (const BlockHash& k : salted) CHECK((k.hi & BlockHasher::kSaltedBit) != 0);
  }
  // With XXH3-128 itself, salted_only changes nothing.
  BlockHashOptions o;
  o.salted_only = true;
  const BlockHasher x(o);
  CHECK_FALSE(x.salted_only());
  Prompt p;
  p.tokens.assign(32, 9);
  std::vector<BlockHash> plain(2);
  hash_pages({}, p.tokens, 16, 0, plain);
  CHECK(chain_of(p, x, 16) == plain);
}

TEST_CASE("bad key material is a kvmm::Error naming the option", "[caching][hasher]") {
  BlockHashOptions o;
  o.function = BlockHashFunction::kBlake2bKeyed;
  CHECK(
      error_of([&] { BlockHasher h(o); }) ==
      "KVCacheManagerOptions::block_hash.key: 0 bytes; function = blake2b-keyed needs a secret key of 16-64 bytes (32 "
      "random bytes recommended)");
  o.key = std::string(15, 'k');
  CHECK(error_of([&] { BlockHasher h(o); }).starts_with("KVCacheManagerOptions::block_hash.key: 15 bytes;"));
  o.key = std::string(65, 'k');
  CHECK(error_of([&] { BlockHasher h(o); }).starts_with("KVCacheManagerOptions::block_hash.key: 65 bytes;"));
  o.key = std::string(32, '\0');
  CHECK(error_of([&] { BlockHasher h(o); }) ==
        "KVCacheManagerOptions::block_hash.key: 32 bytes all equal to 0x00; function = blake2b-keyed needs a random "
        "secret key");
  o.key = kKey;
  o.function = BlockHashFunction::kSha256;
  CHECK(error_of([&] { BlockHasher h(o); }) ==
        "KVCacheManagerOptions::block_hash.key: 32 bytes given, but function = sha256 takes no key (only "
        "blake2b-keyed does)");
  o.function = static_cast<BlockHashFunction>(9);
  CHECK(error_of([&] { BlockHasher h(o); }).starts_with("KVCacheManagerOptions::block_hash.function = 9"));
  // A 16-byte and a 64-byte key are taken, and two keys give two key spaces.
  o.function = BlockHashFunction::kBlake2bKeyed;
  o.key = "0123456789abcdef";
  const BlockHasher k16(o);
  o.key = std::string(kKey) + kKey;
  const BlockHasher k64(o);
  const std::vector<std::uint32_t> t(16, 1);
  CHECK_FALSE(k16.hash_page(false, {}, t, {}) == k64.hash_page(false, {}, t, {}));
}
