// The mini model: embeddings, per layer RMSNorm -> (attention | recurrent) -> residual,
// RMSNorm -> ReLU MLP -> residual, then the unembedding. Plain float loops in a fixed
// order, so a token's result never depends on how it was batched, chunked or paged.
#include "mini_engine.hpp"

#include "kvmm/error.hpp"
#include "kvmm/kernels/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mini {
namespace {

// splitmix64: seeded, portable weights.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f; }
};

std::vector<float> random_matrix(Rng& rng, std::uint32_t rows, std::uint32_t cols, float scale) {
  std::vector<float> m(std::size_t{rows} * cols);
  for (float& x : m) x = rng.uniform() * scale;
  return m;
}

// y[0..cols) (+)= x[0..rows) W[rows][cols]; accumulation order fixed (row by row).
void matvec(const float* x, const std::vector<float>& w, std::uint32_t rows, std::uint32_t cols, float* y,
            bool accumulate) {
  if (!accumulate) std::fill(y, y + cols, 0.0f);
  for (std::uint32_t i = 0; i < rows; ++i) {
    const float xi = x[i];
    const float* wr = w.data() + std::size_t{i} * cols;
    for (std::uint32_t j = 0; j < cols; ++j) y[j] += xi * wr[j];
  }
}

void rmsnorm(const float* x, std::uint32_t n, float* y) {
  double ss = 0.0;
  for (std::uint32_t i = 0; i < n; ++i) ss += double{x[i]} * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + 1e-5));
  for (std::uint32_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

// Rotary position embedding on one token's heads.
void rope(float* v, std::uint32_t heads, std::uint32_t dim, std::uint32_t pos) {
  for (std::uint32_t h = 0; h < heads; ++h)
    for (std::uint32_t i = 0; i < dim / 2; ++i) {
      const double theta = pos * std::pow(10000.0, -2.0 * i / dim);
      const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
      float* p = v + std::size_t{h} * dim + 2 * i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
}

}  // namespace

Model::Model(ModelConfig config) : cfg_(std::move(config)) {
  if (cfg_.layers.empty()) kvmm::fail("config.layers: empty");
  if (cfg_.vocab < 2) kvmm::fail("config.vocab = {}: need at least 2 tokens", cfg_.vocab);
  Rng rng{cfg_.seed};
  const std::uint32_t H = cfg_.hidden, qd = cfg_.q_heads * cfg_.head_dim, kd = cfg_.kv_heads * cfg_.head_dim;
  embed_ = random_matrix(rng, cfg_.vocab, H, 1.0f);
  unembed_ = random_matrix(rng, H, cfg_.vocab, 1.0f / std::sqrt(float(H)));
  // Group and slot of each layer: the planned layout's layer map (its groups name their
  // layers; the planner may slice them, LayoutOptions::slice_layers).
  const kvmm::KVLayout planned = layout();
  for (std::uint32_t i = 0; i < cfg_.layers.size(); ++i) {
    const kvmm::LayerSlot s = planned.layer_group(i);
    group_.push_back(s.group);
    index_.push_back(s.slot);
  }
  for (LayerType t : cfg_.layers) {
    Layer l;
    if (t == LayerType::kRecurrent) {
      const std::uint32_t S = cfg_.state_dim;
      l.win = random_matrix(rng, H, H, 1.0f / std::sqrt(float(H)));
      l.a = random_matrix(rng, H, S, 1.0f);
      for (float& a : l.a) a = 0.75f + 0.2f * a;  // decay in (0.55, 0.95): a stable recurrence
      l.b = random_matrix(rng, H, S, 1.0f);
      l.c = random_matrix(rng, H, S, 0.5f);
      l.wout = random_matrix(rng, H, H, 1.0f / std::sqrt(float(H)));
    } else {
      l.wq = random_matrix(rng, H, qd, 2.0f / std::sqrt(float(H)));
      l.wk = random_matrix(rng, H, kd, 2.0f / std::sqrt(float(H)));
      l.wv = random_matrix(rng, H, kd, 1.0f / std::sqrt(float(H)));
      l.wo = random_matrix(rng, qd, H, 1.0f / std::sqrt(float(qd)));
    }
    l.w1 = random_matrix(rng, H, cfg_.ffn, 1.0f / std::sqrt(float(H)));
    l.w2 = random_matrix(rng, cfg_.ffn, H, 1.0f / std::sqrt(float(cfg_.ffn)));
    w_.push_back(std::move(l));
  }
}

kvmm::KVLayout Model::layout() const {
  std::uint32_t count[3] = {0, 0, 0};
  std::vector<std::uint32_t> members[3];
  for (std::uint32_t i = 0; i < cfg_.layers.size(); ++i) {
    ++count[static_cast<int>(cfg_.layers[i])];
    members[static_cast<int>(cfg_.layers[i])].push_back(i);
  }
  std::vector<kvmm::LayerGroup> groups;
  const std::uint32_t P = cfg_.tokens_per_page;
  if (count[0] > 0)
    groups.push_back(kvmm::LayerGroup::full_attention("full", count[0], cfg_.kv_heads, cfg_.head_dim, 2, P));
  if (count[1] > 0)
    groups.push_back(
        kvmm::LayerGroup::sliding_window("sliding", count[1], cfg_.kv_heads, cfg_.head_dim, 2, P, cfg_.window));
  if (count[2] > 0)
    groups.push_back(
        kvmm::LayerGroup::mamba_state("recurrent", count[2], std::uint64_t{state_floats()} * sizeof(float), P));
  for (kvmm::LayerGroup& g : groups) {
    if (!g.is_state()) g.kv_order = cfg_.kv_order;
    g.layers = members[g.kind == kvmm::LayerKind::kFullAttention   ? 0
                       : g.kind == kvmm::LayerKind::kSlidingWindow ? 1
                                                                   : 2];
  }
  return kvmm::KVLayout::plan(std::move(groups));
}

void Model::forward(std::span<const BatchSeq> batch, std::span<const std::uint32_t> tokens,
                    std::span<const std::uint8_t> logits_for, KVStore& store, std::vector<float>& logits) {
  namespace kk = kvmm::kernels;
  const std::uint32_t T = static_cast<std::uint32_t>(tokens.size());
  const std::uint32_t H = cfg_.hidden, qd = cfg_.q_heads * cfg_.head_dim, kd = cfg_.kv_heads * cfg_.head_dim;
  h_.resize(std::size_t{T} * H);
  x_.resize(std::size_t{T} * H);
  for (std::uint32_t t = 0; t < T; ++t) {
    if (tokens[t] >= cfg_.vocab) kvmm::fail("tokens[{}] = {}: not below vocab {}", t, tokens[t], cfg_.vocab);
    std::memcpy(&h_[std::size_t{t} * H], &embed_[std::size_t{tokens[t]} * H], H * sizeof(float));
  }
  // Position of every batch token.
  std::vector<std::uint32_t>& pos = pos_;
  pos.resize(T);
  for (std::uint32_t i = 0, t = 0; i < batch.size(); ++i)
    for (std::uint32_t j = 0; j < batch[i].len; ++j) pos[t++] = batch[i].start + j;

  for (std::uint32_t l = 0; l < cfg_.layers.size(); ++l) {
    const Layer& w = w_[l];
    for (std::uint32_t t = 0; t < T; ++t) rmsnorm(&h_[std::size_t{t} * H], H, &x_[std::size_t{t} * H]);
    if (cfg_.layers[l] != LayerType::kRecurrent) {
      t1_.resize(std::size_t{T} * (qd + 2 * kd));
      q16_.resize(std::size_t{T} * qd);
      o16_.resize(std::size_t{T} * qd);
      k16_.resize(std::size_t{T} * kd);
      v16_.resize(std::size_t{T} * kd);
      for (std::uint32_t t = 0; t < T; ++t) {
        float* q = &t1_[std::size_t{t} * (qd + 2 * kd)];
        float* k = q + qd;
        float* v = k + kd;
        matvec(&x_[std::size_t{t} * H], w.wq, H, qd, q, false);
        matvec(&x_[std::size_t{t} * H], w.wk, H, kd, k, false);
        matvec(&x_[std::size_t{t} * H], w.wv, H, kd, v, false);
        rope(q, cfg_.q_heads, cfg_.head_dim, pos[t]);
        rope(k, cfg_.kv_heads, cfg_.head_dim, pos[t]);
        for (std::uint32_t j = 0; j < qd; ++j) q16_[std::size_t{t} * qd + j] = kk::float_to_f16(q[j]);
        for (std::uint32_t j = 0; j < kd; ++j) {
          k16_[std::size_t{t} * kd + j] = kk::float_to_f16(k[j]);
          v16_[std::size_t{t} * kd + j] = kk::float_to_f16(v[j]);
        }
      }
      store.attention(l, batch, T, q16_.data(), k16_.data(), v16_.data(), o16_.data());
      t2_.resize(qd);
      for (std::uint32_t t = 0; t < T; ++t) {
        for (std::uint32_t j = 0; j < qd; ++j) t2_[j] = kk::f16_to_float(o16_[std::size_t{t} * qd + j]);
        matvec(t2_.data(), w.wo, qd, H, &h_[std::size_t{t} * H], true);
      }
    } else {
      // Diagonal linear recurrence per channel i and state j: s = a*s + b*u_i; y_i = sum_j c*s.
      const std::uint32_t S = cfg_.state_dim;
      state_.resize(state_floats());
      t1_.resize(H);
      t2_.resize(H);
      for (std::uint32_t i = 0, t = 0; i < batch.size(); ++i) {
        const BatchSeq& s = batch[i];
        if (s.start > 0)
          store.load_state(l, s, s.start, state_.data());
        else
          std::fill(state_.begin(), state_.end(), 0.0f);
        for (std::uint32_t j = 0; j < s.len; ++j, ++t) {
          matvec(&x_[std::size_t{t} * H], w.win, H, H, t1_.data(), false);
          for (std::uint32_t c = 0; c < H; ++c) {
            float y = 0.0f;
            for (std::uint32_t k = 0; k < S; ++k) {
              float& st = state_[std::size_t{c} * S + k];
              st = w.a[std::size_t{c} * S + k] * st + w.b[std::size_t{c} * S + k] * t1_[c];
              y += w.c[std::size_t{c} * S + k] * st;
            }
            t2_[c] = y;
          }
          store.store_state(l, s, s.start + j, state_.data());
          matvec(t2_.data(), w.wout, H, H, &h_[std::size_t{t} * H], true);
        }
      }
    }
    // MLP.
    t1_.resize(cfg_.ffn);
    for (std::uint32_t t = 0; t < T; ++t) {
      rmsnorm(&h_[std::size_t{t} * H], H, &x_[std::size_t{t} * H]);
      matvec(&x_[std::size_t{t} * H], w.w1, H, cfg_.ffn, t1_.data(), false);
      for (float& a : t1_) a = std::max(a, 0.0f);
      matvec(t1_.data(), w.w2, cfg_.ffn, H, &h_[std::size_t{t} * H], true);
    }
  }
  logits.resize(batch.size() * std::size_t{cfg_.vocab});
  for (std::uint32_t i = 0, t = 0; i < batch.size(); ++i) {
    t += batch[i].len;
    if (!logits_for[i]) continue;
    rmsnorm(&h_[std::size_t{t - 1} * H], H, x_.data());
    matvec(x_.data(), unembed_, H, cfg_.vocab, &logits[std::size_t{i} * cfg_.vocab], false);
  }
}

std::uint32_t pick_token(std::span<const float> logits, std::uint32_t rank) {
  if (rank >= logits.size()) kvmm::fail("rank = {}: only {} tokens", rank, logits.size());
  if (rank == 0)  // greedy: argmax, lowest index on ties
    return static_cast<std::uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<std::uint32_t> idx(logits.size());
  for (std::uint32_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::partial_sort(idx.begin(), idx.begin() + rank + 1, idx.end(), [&](std::uint32_t a, std::uint32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  return idx[rank];
}

std::vector<Request> shared_prefix_workload(std::uint32_t count, std::uint32_t vocab, std::uint64_t seed) {
  return shared_prefix_workload(count, vocab, seed, seed);
}

std::vector<Request> shared_prefix_workload(std::uint32_t count, std::uint32_t vocab, std::uint64_t seed,
                                            std::uint64_t suffix_seed) {
  Rng system_rng{seed}, suffix_rng{suffix_seed};
  // One seed: one stream for everything (the workload the tests and results were made with).
  Rng& rng = suffix_seed == seed ? system_rng : suffix_rng;
  auto below = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng.next() % n); };
  std::vector<std::vector<std::uint32_t>> systems(3);
  const std::uint32_t system_len[3] = {12, 17, 8};
  for (std::uint32_t i = 0; i < 3; ++i)
    for (std::uint32_t j = 0; j < system_len[i]; ++j)
      systems[i].push_back(static_cast<std::uint32_t>(system_rng.next() % vocab));
  std::vector<Request> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    Request r;
    r.prompt = systems[below(3)];
    for (std::uint32_t j = 0, n = 3 + below(9); j < n; ++j) r.prompt.push_back(below(vocab));
    r.max_new_tokens = 6 + below(8);
    r.n = i % 3 == 2 ? 2 + below(2) : 1;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace mini
