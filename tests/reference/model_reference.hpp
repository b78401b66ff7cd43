// SPDX-License-Identifier: MIT
#pragma once
// Naive oracles for model/: an O(n^2) SentencePiece-BPE encoder and a
// double-precision Llama-family forward pass over whole sequences (no cache),
// written from the architectures' definitions: llama (interleaved RoPE
// pairs (2i, 2i+1)), qwen2 (Q/K/V biases, split-half pairs (i, i+rot/2)) and
// qwen3 (split-half pairs, RMSNorm of every Q and K head before RoPE, heads
// of attention.key_length), gemma2 / gemma3 (embeddings times sqrt(dim),
// RMSNorms of the attention and FFN outputs, GELU-tanh gate, local layers
// seeing the last `window` positions with their own RoPE base, attention
// and final soft-capping, Q/K norms for gemma3), phi3 (Q|K|V and gate|up
// each one tensor, LongRoPE divisors chosen by the context, cos and sin
// times rope.scaling.attn_factor) and llama with a sliding window, each with
// optional rope_freqs.weight frequency divisors.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <llmkit/core/dtype.hpp>
#include <llmkit/model/gguf.hpp>

#include "moe_reference.hpp"
#include "quants_reference.hpp"

namespace llmkit::reference {

/// BPE by rescanning all adjacent pairs after every merge: the highest-score
/// pair that is a token wins, the leftmost on ties; pieces not in the
/// vocabulary fall back to <0xXX> byte tokens, else `unk`.
inline std::vector<std::int32_t> spm_encode(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                                            std::string_view text, bool add_space_prefix, std::int32_t unk) {
  std::map<std::string, std::int32_t> index;
  for (std::size_t i = 0; i < tokens.size(); ++i) index.emplace(tokens[i], static_cast<std::int32_t>(i));
  std::vector<std::int32_t> out;
  if (text.empty()) return out;
  std::string s = add_space_prefix ? "\xe2\x96\x81" : "";
  for (char c : text) s += (c == ' ') ? std::string("\xe2\x96\x81") : std::string(1, c);
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n > s.size() - i) n = s.size() - i;
    pieces.push_back(s.substr(i, n));
    i += n;
  }
  for (;;) {
    std::size_t best = pieces.size();
    float best_score = 0;
    for (std::size_t i = 0; i + 1 < pieces.size(); ++i) {
      auto it = index.find(pieces[i] + pieces[i + 1]);
      if (it == index.end()) continue;
      const float sc = scores[static_cast<std::size_t>(it->second)];
      if (best == pieces.size() || sc > best_score) {
        best = i;
        best_score = sc;
      }
    }
    if (best == pieces.size()) break;
    pieces[best] += pieces[best + 1];
    pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const auto& p : pieces) {
    if (auto it = index.find(p); it != index.end()) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char c : p) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", c);
      auto it = index.find(name);
      out.push_back(it != index.end() ? it->second : unk);
    }
  }
  return out;
}

/// A Llama-family forward pass in double precision over one whole sequence
/// (no cache, dense causal attention), weights read straight from the GGUF.
struct llama_reference {
  std::size_t n_vocab = 0, dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, rot = 0;
  double eps = 1e-5, theta = 10000.0, freq_scale = 1.0;
  bool neox = false;       // split-half RoPE pairs (qwen2)
  bool qkv_bias = false;   // blk.N.attn_{q,k,v}.bias (qwen2)
  bool qk_norm = false;    // blk.N.attn_{q,k}_norm.weight (qwen3, gemma3)
  bool gemma = false;      // sqrt(dim) embeddings, post-norms, GELU-tanh gate
  std::size_t window = 0;  // sliding window of the local layers, 0: none
  std::vector<bool> local; // [n_layers] local layers
  double local_theta = 10000.0, local_freq_scale = 1.0;
  bool local_yarn = true;  // YaRN on the local layers too (not Gemma 3's unscaled ones)
  double scale = 0.0, attn_cap = 0.0, final_cap = 0.0;  // 0: 1/sqrt(head_dim), none, none
  bool fused = false;         // attn_qkv, ffn_up = gate|up (phi3)
  double attn_factor = 1.0;   // rope.scaling.attn_factor
  // YaRN (rope.scaling.type "yarn"): ext_factor 0 is off.
  double yarn_ext = 0.0, yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  std::size_t context = 0, original_context = 0;  // LongRoPE: long factors when context > original_context
  std::vector<double> long_factors, short_factors;
  std::vector<double> freq_factors;  // rope_freqs.weight, empty when absent
  // Mixture of experts (qwen3moe): softmax over the router's logits, the
  // n_used most probable (renormalised when norm_w), their SwiGLU FFNs.
  std::size_t n_expert = 0, n_used = 0, expert_ffn = 0;
  bool norm_w = true;
  // qwen2moe: Qwen2's attention; no renormalisation unless the file says;
  // a shared SwiGLU expert of width shared_ffn scaled by sigmoid(g . x).
  bool qwen2moe = false;
  std::size_t shared_ffn = 0;
  // gpt-oss: attn_output.bias, attn_sinks, the FFN norm named post_attention_norm,
  // a router bias and top-k then softmax, expert biases, the clamped SwiGLU.
  bool gpt_oss = false;
  const model::gguf_file* file = nullptr;

  explicit llama_reference(const model::gguf_file& f) : file(&f) {
    const std::string arch(f.get<std::string_view>("general.architecture"));
    const std::string p = arch + ".";
    gemma = arch == "gemma2" || arch == "gemma3";
    fused = arch == "phi3";
    neox = arch == "qwen2" || arch == "qwen3" || gemma || fused;
    gpt_oss = arch == "gpt-oss";
    qwen2moe = arch == "qwen2moe";
    qkv_bias = arch == "qwen2" || gpt_oss || qwen2moe;
    qk_norm = arch == "qwen3" || arch == "gemma3" || arch == "qwen3moe";
    neox = neox || arch == "qwen3moe" || gpt_oss || qwen2moe;
    if (arch == "qwen3moe" || gpt_oss || qwen2moe) {
      n_expert = f.get<std::size_t>(p + "expert_count");
      n_used = f.get<std::size_t>(p + "expert_used_count");
      expert_ffn = f.get<std::size_t>(p + "expert_feed_forward_length");
      norm_w = f.get_optional<bool>(p + "expert_weights_norm").value_or(!qwen2moe);
    }
    if (qwen2moe)
      shared_ffn = f.get_optional<std::size_t>(p + "expert_shared_feed_forward_length")
                       .value_or(f.get<std::size_t>(p + "feed_forward_length"));
    dim = f.get<std::size_t>(p + "embedding_length");
    n_layers = f.get<std::size_t>(p + "block_count");
    n_heads = f.get<std::size_t>(p + "attention.head_count");
    n_kv_heads = f.get_optional<std::size_t>(p + "attention.head_count_kv").value_or(n_heads);
    ffn = f.get_optional<std::size_t>(p + "feed_forward_length").value_or(0);
    head_dim = f.get_optional<std::size_t>(p + "attention.key_length").value_or(dim / n_heads);
    rot = f.get_optional<std::size_t>(p + "rope.dimension_count").value_or(head_dim);
    eps = f.get_optional<double>(p + "attention.layer_norm_rms_epsilon").value_or(1e-5);
    theta = f.get_optional<double>(p + "rope.freq_base").value_or(10000.0);
    if (auto factor = f.get_optional<double>(p + "rope.scaling.factor")) freq_scale = 1.0 / *factor;
    if (f.find_tensor("rope_freqs.weight")) freq_factors = load("rope_freqs.weight");
    n_vocab = f.tensor("token_embd.weight").rows();
    context = f.get_optional<std::size_t>(p + "context_length").value_or(2048);
    original_context = f.get_optional<std::size_t>(p + "rope.scaling.original_context_length").value_or(context);
    attn_factor = f.get_optional<double>(p + "rope.scaling.attn_factor").value_or(1.0);
    if (f.get_optional<std::string_view>(p + "rope.scaling.type").value_or("") == "yarn") {
      yarn_ext = f.get_optional<double>(p + "rope.scaling.yarn_ext_factor").value_or(1.0);
      yarn_beta_fast = f.get_optional<double>(p + "rope.scaling.yarn_beta_fast").value_or(32.0);
      yarn_beta_slow = f.get_optional<double>(p + "rope.scaling.yarn_beta_slow").value_or(1.0);
    }
    if (f.find_tensor("rope_factors_long.weight")) {
      long_factors = load("rope_factors_long.weight");
      short_factors = load("rope_factors_short.weight");
    }
    scale = f.get_optional<double>(p + "attention.scale").value_or(0.0);
    attn_cap = f.get_optional<double>(p + "attn_logit_softcapping").value_or(0.0);
    final_cap = f.get_optional<double>(p + "final_logit_softcapping").value_or(0.0);
    window = f.get_optional<std::size_t>(p + "attention.sliding_window").value_or(0);
    local.assign(n_layers, false);
    local_theta = theta;
    local_freq_scale = freq_scale;
    // A phi3 window at or beyond the context is full attention.
    if (window == 0 || (arch == "phi3" && window >= context)) {
      window = 0;
      return;
    }
    if (const auto* a = f.find(p + "attention.sliding_window_pattern");
        a != nullptr && std::holds_alternative<model::gguf_array>(*a)) {
      for (std::size_t l = 0; l < n_layers; ++l) local[l] = std::get<model::gguf_array>(*a).get<bool>(l);
    } else {
      // Gemma 2: even layers local; Gemma 3: five local, then one global.
      const std::size_t every = arch == "gemma2" || gpt_oss ? 2 : arch == "gemma3" ? 6 : 0;
      for (std::size_t l = 0; l < n_layers; ++l) local[l] = every == 0 || (l + 1) % every != 0;
    }
    if (arch == "gemma3") {
      local_theta = 10000.0;
      local_freq_scale = 1.0;
      local_yarn = false;
    }
  }

  // Element i of a tensor as double, decoded from the file's bytes.
  double at(const model::gguf_tensor& t, std::size_t i) const {
    switch (t.type) {
      case model::ggml_type::f32: {
        float v;
        std::memcpy(&v, t.data + 4 * i, 4);
        return v;
      }
      case model::ggml_type::f16: {
        std::uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        return f16_bits_to_f32(b);
      }
      case model::ggml_type::bf16: {
        std::uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        return bf16_bits_to_f32(b);
      }
      default: return quant_value(t.type, t.data, i);
    }
  }
  std::vector<double> load(const std::string& name) const {
    const auto& t = file->tensor(name);
    std::vector<double> v(t.n_elements);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = at(t, i);
    return v;
  }
  static std::vector<double> softmax(const std::vector<double>& z) {
    double m = -1e300, sum = 0;
    for (double v : z) m = std::max(m, v);
    std::vector<double> p(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) sum += p[i] = std::exp(z[i] - m);
    for (double& v : p) v /= sum;
    return p;
  }
  // y[o] = sum_i w[o * in + i] * x[i]
  static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x, std::size_t out) {
    std::vector<double> y(out, 0.0);
    const std::size_t in = x.size();
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
    return y;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  // RMSNorm of each head_dim-wide head of v, one weight for all heads.
  void head_norm(std::vector<double>& v, std::size_t n_h, const std::vector<double>& w) const {
    for (std::size_t h = 0; h < n_h; ++h) {
      const std::vector<double> head(v.begin() + std::ptrdiff_t(h * head_dim),
                                     v.begin() + std::ptrdiff_t((h + 1) * head_dim));
      const auto normed = rmsnorm(head, w);
      std::copy(normed.begin(), normed.end(), v.begin() + std::ptrdiff_t(h * head_dim));
    }
  }
  // Pair i turns by pos * freq_scale * theta^(-2i/rot) / freq_factors[i].
  void rope(std::vector<double>& v, std::size_t n_h, std::size_t pos, bool is_local = false) const {
    const double th = is_local ? local_theta : theta, fs = is_local ? local_freq_scale : freq_scale;
    for (std::size_t h = 0; h < n_h; ++h)
      for (std::size_t i = 0; i < rot / 2; ++i) {
        const std::vector<double>& ff =
            long_factors.empty() ? freq_factors : context > original_context ? long_factors : short_factors;
        const double divisor = ff.empty() ? 1.0 : ff[i];
        const double extrapolated = double(pos) * std::pow(th, -2.0 * double(i) / double(rot)) / divisor;
        double angle = fs * extrapolated, magnitude = attn_factor;
        if (yarn_ext != 0.0 && (!is_local || local_yarn)) {
          // YaRN: pair i's angle blends from extrapolated (below the
          // correction range of pair indices) to interpolated (above it).
          auto corr = [&](double beta) {
            return double(rot) * std::log(double(original_context) / (2.0 * M_PI * beta)) / (2.0 * std::log(th));
          };
          const double lo = std::max(0.0, std::floor(corr(yarn_beta_fast)));
          const double hi = std::min(double(rot) - 1.0, std::ceil(corr(yarn_beta_slow)));
          const double mix = (1.0 - std::clamp((double(i) - lo) / std::max(0.001, hi - lo), 0.0, 1.0)) * yarn_ext;
          angle = angle * (1.0 - mix) + extrapolated * mix;
          magnitude *= 1.0 + 0.1 * std::log(1.0 / fs);
        }
        double& a = v[h * head_dim + (neox ? i : 2 * i)];
        double& b = v[h * head_dim + (neox ? i + rot / 2 : 2 * i + 1)];
        const double a0 = a, b0 = b;
        const double c = std::cos(angle) * magnitude, s = std::sin(angle) * magnitude;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
  }

  /// Logits at every position: [tokens.size()][n_vocab].
  std::vector<std::vector<double>> logits(const std::vector<std::int32_t>& tokens) const {
    const std::size_t n = tokens.size(), qd = n_heads * head_dim, kvd = n_kv_heads * head_dim;
    const auto emb = load("token_embd.weight");
    std::vector<std::vector<double>> x(n, std::vector<double>(dim));
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t d = 0; d < dim; ++d)
        x[t][d] = emb[std::size_t(tokens[t]) * dim + d] * (gemma ? std::sqrt(double(dim)) : 1.0);
    for (std::size_t l = 0; l < n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const auto an = load(b + "attn_norm.weight"), wo = load(b + "attn_output.weight"),
                 fn = load(b + (gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"));
      std::vector<double> wq, wk, wv, wg, wu, wd, router, sg, sg_gate, sg_up, sg_down;  // sg*: qwen2moe's shared expert
      std::vector<double> bo(dim, 0.0), sinks, router_b, bg, bu, bd;  // gpt-oss's
      if (gpt_oss) {
        bo = load(b + "attn_output.bias");
        sinks = load(b + "attn_sinks.weight");
        router_b = load(b + "ffn_gate_inp.bias");
        bg = load(b + "ffn_gate_exps.bias");
        bu = load(b + "ffn_up_exps.bias");
        bd = load(b + "ffn_down_exps.bias");
      }
      if (n_expert != 0) {
        router = load(b + "ffn_gate_inp.weight");
        wg = load(b + "ffn_gate_exps.weight");
        wu = load(b + "ffn_up_exps.weight");
        wd = load(b + "ffn_down_exps.weight");
        if (qwen2moe) {
          sg = load(b + "ffn_gate_inp_shexp.weight");
          sg_gate = load(b + "ffn_gate_shexp.weight");
          sg_up = load(b + "ffn_up_shexp.weight");
          sg_down = load(b + "ffn_down_shexp.weight");
        }
      } else {
        wd = load(b + "ffn_down.weight");
      }
      if (fused) {  // rows [0, qd) | [qd, qd + kvd) | [qd + kvd, qd + 2 kvd); gate rows, then up rows
        const auto qkv = load(b + "attn_qkv.weight"), gu = load(b + "ffn_up.weight");
        const auto rows = [&](const std::vector<double>& m, std::size_t first, std::size_t count) {
          return std::vector<double>(m.begin() + std::ptrdiff_t(first * dim), m.begin() + std::ptrdiff_t((first + count) * dim));
        };
        wq = rows(qkv, 0, qd);
        wk = rows(qkv, qd, kvd);
        wv = rows(qkv, qd + kvd, kvd);
        wg = rows(gu, 0, ffn);
        wu = rows(gu, ffn, ffn);
      } else {
        wq = load(b + "attn_q.weight");
        wk = load(b + "attn_k.weight");
        wv = load(b + "attn_v.weight");
        if (n_expert == 0) {
          wg = load(b + "ffn_gate.weight");
          wu = load(b + "ffn_up.weight");
        }
      }
      std::vector<double> bq(qd, 0.0), bk(kvd, 0.0), bv(kvd, 0.0);
      if (qkv_bias) {
        bq = load(b + "attn_q.bias");
        bk = load(b + "attn_k.bias");
        bv = load(b + "attn_v.bias");
      }
      std::vector<double> qn, kn, pan, pfn;
      if (gemma) {
        pan = load(b + "post_attention_norm.weight");
        pfn = load(b + "post_ffw_norm.weight");
      }
      if (qk_norm) {
        qn = load(b + "attn_q_norm.weight");
        kn = load(b + "attn_k_norm.weight");
      }
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (std::size_t t = 0; t < n; ++t) {
        const auto xn = rmsnorm(x[t], an);
        q[t] = matvec(wq, xn, qd);
        k[t] = matvec(wk, xn, kvd);
        v[t] = matvec(wv, xn, kvd);
        for (std::size_t j = 0; j < qd; ++j) q[t][j] += bq[j];
        for (std::size_t j = 0; j < kvd; ++j) k[t][j] += bk[j];
        for (std::size_t j = 0; j < kvd; ++j) v[t][j] += bv[j];
        if (qk_norm) {
          head_norm(q[t], n_heads, qn);
          head_norm(k[t], n_kv_heads, kn);
        }
        rope(q[t], n_heads, t, local[l]);
        rope(k[t], n_kv_heads, t, local[l]);
      }
      for (std::size_t t = 0; t < n; ++t) {
        std::vector<double> att(qd, 0.0);
        for (std::size_t h = 0; h < n_heads; ++h) {
          const std::size_t g = h / (n_heads / n_kv_heads);
          std::vector<double> s(t + 1, 0.0);
          double m = -1e300;
          // Keys j <= t, and t - j < window in a local layer.
          const std::size_t first = local[l] && t + 1 > window ? t + 1 - window : 0;
          for (std::size_t j = first; j <= t; ++j) {
            double d = 0;
            for (std::size_t e = 0; e < head_dim; ++e) d += q[t][h * head_dim + e] * k[j][g * head_dim + e];
            s[j] = d * (scale != 0.0 ? scale : 1.0 / std::sqrt(double(head_dim)));
            if (attn_cap != 0.0) s[j] = attn_cap * std::tanh(s[j] / attn_cap);
            m = std::max(m, s[j]);
          }
          double z = sinks.empty() ? 0.0 : std::exp(sinks[h] - m);  // a sink: a term with no value
          for (std::size_t j = first; j <= t; ++j) z += (s[j] = std::exp(s[j] - m));
          for (std::size_t j = first; j <= t; ++j)
            for (std::size_t e = 0; e < head_dim; ++e) att[h * head_dim + e] += s[j] / z * v[j][g * head_dim + e];
        }
        auto o = matvec(wo, att, dim);
        for (std::size_t d = 0; d < dim; ++d) o[d] += bo[d];
        if (gemma) o = rmsnorm(o, pan);
        for (std::size_t d = 0; d < dim; ++d) x[t][d] += o[d];
        const auto xn = rmsnorm(x[t], fn);
        if (n_expert != 0) {
          auto logit = matvec(router, xn, n_expert);
          for (std::size_t e = 0; e < router_b.size(); ++e) logit[e] += router_b[e];
          // Qwen3-MoE: softmax over all, the k best (renormalised); gpt-oss: the k largest logits, softmax over them.
          const auto p = gpt_oss ? logit : softmax(logit);
          const auto ids = best_k(p, n_used);
          std::vector<double> weight(n_expert, 0.0);
          double sum = 0;
          if (gpt_oss) {
            const double m = p[std::size_t(ids[0])];
            for (auto e : ids) sum += weight[std::size_t(e)] = std::exp(p[std::size_t(e)] - m);
            for (auto e : ids) weight[std::size_t(e)] /= sum;
          } else {
            for (auto e : ids) sum += p[std::size_t(e)];
            for (auto e : ids) weight[std::size_t(e)] = p[std::size_t(e)] / (norm_w ? sum : 1.0);
          }
          for (auto e : ids) {
            const std::size_t f = expert_ffn, off = std::size_t(e) * f * dim;
            std::vector<double> h(f);
            for (std::size_t j = 0; j < f; ++j) {
              double gv = bg.empty() ? 0.0 : bg[std::size_t(e) * f + j], uv = bu.empty() ? 0.0 : bu[std::size_t(e) * f + j];
              for (std::size_t i = 0; i < dim; ++i) {
                gv += wg[off + j * dim + i] * xn[i];
                uv += wu[off + j * dim + i] * xn[i];
              }
              if (gpt_oss) {  // clamped SwiGLU: min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1)
                gv = std::min(gv, 7.0);
                h[j] = gv / (1.0 + std::exp(-1.702 * gv)) * (std::clamp(uv, -7.0, 7.0) + 1.0);
              } else {
                h[j] = gv / (1.0 + std::exp(-gv)) * uv;
              }
            }
            for (std::size_t d = 0; d < dim; ++d) {
              double y = bd.empty() ? 0.0 : bd[std::size_t(e) * dim + d];
              for (std::size_t j = 0; j < f; ++j) y += wd[off + d * f + j] * h[j];
              x[t][d] += weight[std::size_t(e)] * y;
            }
          }
          if (qwen2moe) {  // the shared expert, gated by sigmoid(g . xn)
            double g = 0;
            for (std::size_t i = 0; i < dim; ++i) g += sg[i] * xn[i];
            const auto gate = matvec(sg_gate, xn, shared_ffn), up = matvec(sg_up, xn, shared_ffn);
            std::vector<double> h(shared_ffn);
            for (std::size_t j = 0; j < shared_ffn; ++j) h[j] = gate[j] / (1.0 + std::exp(-gate[j])) * up[j];
            const auto down = matvec(sg_down, h, dim);
            for (std::size_t d = 0; d < dim; ++d) x[t][d] += down[d] / (1.0 + std::exp(-g));
          }
          continue;
        }
        const auto gate = matvec(wg, xn, ffn), up = matvec(wu, xn, ffn);
        std::vector<double> h(ffn);
        for (std::size_t j = 0; j < ffn; ++j) {
          const double gv = gate[j];
          const double act = gemma ? 0.5 * gv * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) *
                                                                 (gv + 0.044715 * gv * gv * gv)))
                                   : gv / (1.0 + std::exp(-gv));
          h[j] = act * up[j];
        }
        auto down = matvec(wd, h, dim);
        if (gemma) down = rmsnorm(down, pfn);
        for (std::size_t d = 0; d < dim; ++d) x[t][d] += down[d];
      }
    }
    const auto on = load("output_norm.weight");
    const auto wout = load(file->find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
    std::vector<std::vector<double>> out(n);
    for (std::size_t t = 0; t < n; ++t) {
      out[t] = matvec(wout, rmsnorm(x[t], on), n_vocab);
      if (final_cap != 0.0)
        for (auto& v : out[t]) v = final_cap * std::tanh(v / final_cap);
    }
    return out;
  }
};

/// ggml's Q8_0 x Q8_0 product in double: each 32-value block of an
/// activation row x [n, cols] is quantised as quantize_q8_0 does (f32 scale
/// d = amax / 127, q = round(x * (1 / d)) in f32), then
/// y[t, o] = sum_b d_x[t, b] * d_w[o, b] * sum_j q_x * q_w, with the int8
/// weights q_w [rows, cols] and their block scales d_w [rows, cols / 32].
/// mag gets sum |d_x d_w q_x q_w| per output, for error bounds.
inline void q8_q8_product(const std::vector<float>& x, std::size_t n, std::size_t cols, const std::int8_t* qw,
                          const float* dw, std::size_t rows, std::vector<double>& y, std::vector<double>& mag) {
  const std::size_t blocks = cols / 32;
  std::vector<int> qx(n * cols);
  std::vector<double> dx(n * blocks);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[t * cols + b * 32 + j]));
      const float d = amax / 127.0f;
      const float inv = d != 0.0f ? 1.0f / d : 0.0f;
      dx[t * blocks + b] = d;
      for (std::size_t j = 0; j < 32; ++j) qx[t * cols + b * 32 + j] = int(std::round(x[t * cols + b * 32 + j] * inv));
    }
  y.assign(n * rows, 0.0);
  mag.assign(n * rows, 0.0);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t o = 0; o < rows; ++o)
      for (std::size_t b = 0; b < blocks; ++b) {
        long dot = 0, abs_dot = 0;
        for (std::size_t j = 0; j < 32; ++j) {
          const long p = long(qx[t * cols + b * 32 + j]) * long(qw[o * cols + b * 32 + j]);
          dot += p;
          abs_dot += p < 0 ? -p : p;
        }
        const double d = dx[t * blocks + b] * double(dw[o * blocks + b]);
        y[t * rows + o] += d * double(dot);
        mag[t * rows + o] += std::abs(d) * double(abs_dot);
      }
}

/// The same product in the f32 arithmetic every Q8_0 x int8 kernel is held
/// to bit for bit (model/detail/matmul_q8.hpp): the exact integer dot of
/// each block, then y = fma(float(dot), d_x * d_w, y) in f32, blocks
/// ascending. [n, rows] result.
inline std::vector<float> q8_q8_product_f32(const std::vector<float>& x, std::size_t n, std::size_t cols,
                                            const std::int8_t* qw, const float* dw, std::size_t rows) {
  const std::size_t blocks = cols / 32;
  std::vector<float> y(n * rows, 0.0f);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[t * cols + b * 32 + j]));
      const float d = amax / 127.0f;
      const float inv = d != 0.0f ? 1.0f / d : 0.0f;
      long qx[32];
      for (std::size_t j = 0; j < 32; ++j) qx[j] = long(std::round(x[t * cols + b * 32 + j] * inv));
      for (std::size_t o = 0; o < rows; ++o) {
        long dot = 0;
        for (std::size_t j = 0; j < 32; ++j) dot += qx[j] * long(qw[o * cols + b * 32 + j]);
        y[t * rows + o] = std::fma(float(dot), d * dw[o * blocks + b], y[t * rows + o]);
      }
    }
  return y;
}

}  // namespace llmkit::reference
