#include "ingot/model/transformer.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "ingot/core/error.h"
#include "ingot/core/rng.h"
#include "ingot/ops/ops.h"

namespace ingot {

std::vector<double> rope_inverse_frequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
  if (!c.rope_scaling.enabled) return inv_freq;
  // llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
  const RopeScaling& s = c.rope_scaling;
  const double original = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = original / s.low_freq_factor;
  const double high_freq_wavelen = original / s.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_freq_wavelen) {
      f = f / s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv_freq;
}

// Saved activations of one micro-batch (N = B*T tokens) and the backward's scratch.
struct Transformer::Activations {
  struct Layer {
    Tensor ln1, rstd1;        // (N,C), (N)     input RMSNorm
    Tensor qkv_raw;           // (N,Htot,D)     projection output, before qk-norm (qwen3 only)
    Tensor qkv, qk_rstd;      // (N,Htot,D)     after qk-norm and RoPE; (N,Hq+Hkv)
    Tensor attn, lse;         // (N,Hq*D), (B,Hq,T)
    Tensor ln2, rstd2;        // (N,C), (N)     post-attention RMSNorm
    Tensor gate_up, hidden;   // (N,2F), (N,F)
  };
  Tensor input_ids, targets, positions, segment_ids;  // (N) i32; segment_ids absent unless packed
  Tensor inv_freq;                                    // (D/2)
  std::vector<Tensor> residual;                       // 2L+1 of (N,C): layer input, after attention, ...
  std::vector<Layer> layers;
  Tensor lnf, rstdf;                                  // (N,C), (N)
  Tensor logits;                                      // (chunk,V), reused per chunk; dlogits in place
  Tensor losses;                                      // (N)
  Tensor loss_sum;                                    // (1) f64, for the synchronous entry points
  // backward scratch
  Tensor dresidual, dnormed;                          // (N,C)
  Tensor dqkv, dqkv_raw;                              // (N,Htot,D)
  Tensor dattn;                                       // (N,Hq*D)
  Tensor dgate_up, dhidden;                           // (N,2F), (N,F)
  bool packed = false;
};

static int64_t auto_chunk(int64_t tokens, int64_t vocab) {
  // Bound the logits buffer to 512M elements (1 GiB in bf16), so a 150k vocabulary never holds
  // (N,V) at once. Not smaller: every chunk re-reads and re-writes the whole f32 LM-head gradient
  // (dweight accumulates), and small chunks make narrow GEMMs (docs/perf.md has the measurement).
  const int64_t limit = std::max<int64_t>(1, (int64_t{512} << 20) / vocab);
  return std::min(tokens, limit);
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "elementwise") return Recompute::elementwise;
  if (name == "block") return Recompute::block;
  fail("recompute must be none, elementwise or block, got \"", name, "\"");
}

Transformer::Transformer(const ModelConfig& config, const Recipe& recipe, Context& ctx,
                         int64_t micro_batch, int64_t seq_len, int64_t logits_chunk_tokens, Recompute recompute)
    : config_(config), recipe_(recipe), ctx_(ctx), B_(micro_batch), T_(seq_len), recompute_(recompute) {
  INGOT_CHECK(B_ > 0 && T_ > 0, "micro_batch_size and sequence_len must be positive (got ", B_, ", ", T_, ")");
  chunk_ = logits_chunk_tokens > 0 ? std::min(logits_chunk_tokens, B_ * T_) : auto_chunk(B_ * T_, config.vocab_size);
  entries_ = plan_parameters(config_);
  const int64_t P = total_numel(entries_);
  for (const ParamEntry& e : entries_) {
    // Written by a GEMM: the projections, an untied LM head, and a tied embedding (the LM head's
    // first chunk writes it before the embedding backward adds to it). Their alignment padding
    // is zeroed with the rest, so that every element is either written or zeroed.
    const bool gemm_written = e.kind == ParamKind::matrix || (e.kind == ParamKind::embedding && config_.tie_word_embeddings);
    const int64_t begin = gemm_written ? e.offset + e.numel : e.offset, end = e.slot_end();
    if (begin == end) continue;
    if (!accumulated_only_.empty() && accumulated_only_.back().second == begin)
      accumulated_only_.back().second = end;
    else
      accumulated_only_.emplace_back(begin, end);
  }
  param_arena_ = std::make_unique<Arena>("params", ctx.device);
  grad_arena_ = std::make_unique<Arena>("grads", ctx.device);
  activation_arena_ = std::make_unique<Arena>("activations", ctx.device);
  param_arena_->reserve(P * dtype_size(recipe_.param) + Arena::kAlignment);
  grad_arena_->reserve(P * dtype_size(recipe_.grad) + Arena::kAlignment);
  weights_ = param_arena_->allocate(recipe_.param, {P});
  grads_ = grad_arena_->allocate(recipe_.grad, {P});
  params_ = bind_params(config_, entries_, weights_);
  param_grads_ = bind_params(config_, entries_, grads_);
  ops::zero(ctx_, weights_);  // padding between parameters stays defined
  ops::zero(ctx_, grads_);

  Arena measuring("activations", ctx.device);
  plan_activations(config_, recipe_, chunk_, recompute_, measuring, B_, T_);
  activation_arena_->reserve(measuring.used());
  bind_activations(B_, T_);
  active_tokens_ = B_ * T_;
}

Transformer::~Transformer() = default;

std::unique_ptr<Transformer::Activations> Transformer::plan_activations(
    const ModelConfig& c, const Recipe& recipe, int64_t chunk, Recompute recompute, Arena& a, int64_t B, int64_t T) {
  const int64_t N = B * T, C = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, Htot = Hq + 2 * Hkv;
  const DType act = recipe.activation, stat = ops::compute_dtype(act);
  a.reset();
  auto acts = std::make_unique<Activations>();
  Activations& s = *acts;
  s.input_ids = a.allocate(DType::i32, {N});
  s.targets = a.allocate(DType::i32, {N});
  s.positions = a.allocate(DType::i32, {N});
  s.segment_ids = a.allocate(DType::i32, {B, T});
  s.inv_freq = a.allocate(stat, {D / 2});
  for (int64_t i = 0; i < 2 * c.num_hidden_layers + 1; ++i) s.residual.push_back(a.allocate(act, {N, C}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (recompute == Recompute::block && l > 0) {  // every block shares the first block's buffers
      s.layers.push_back(s.layers.front());
      continue;
    }
    // elementwise: the first block allocates the recomputed buffers, the others share them.
    const bool share = recompute == Recompute::elementwise && l > 0;
    const Activations::Layer* first = share ? &s.layers.front() : nullptr;
    Activations::Layer L;
    L.ln1 = share ? first->ln1 : a.allocate(act, {N, C});
    L.rstd1 = a.allocate(stat, {N});
    if (c.qk_norm) {
      L.qkv = share ? first->qkv : a.allocate(act, {N, Htot, D});
      L.qkv_raw = a.allocate(act, {N, Htot, D});
      L.qk_rstd = a.allocate(stat, {N, Hq + Hkv});
    } else {
      L.qkv = a.allocate(act, {N, Htot, D});  // rotated in place: nothing to recompute it from
      L.qkv_raw = L.qkv;
    }
    L.attn = a.allocate(act, {N, Hq * D});
    L.lse = a.allocate(stat, {B, Hq, T});
    L.ln2 = share ? first->ln2 : a.allocate(act, {N, C});
    L.rstd2 = a.allocate(stat, {N});
    L.gate_up = a.allocate(act, {N, 2 * F});
    L.hidden = share ? first->hidden : a.allocate(act, {N, F});
    s.layers.push_back(L);
  }
  s.lnf = a.allocate(act, {N, C});
  s.rstdf = a.allocate(stat, {N});
  s.logits = a.allocate(act, {std::min(chunk, N), c.vocab_size});
  s.losses = a.allocate(stat, {N});
  s.loss_sum = a.allocate(DType::f64, {1});
  s.dresidual = a.allocate(act, {N, C});
  s.dnormed = a.allocate(act, {N, C});
  s.dqkv = a.allocate(act, {N, Htot, D});
  s.dqkv_raw = c.qk_norm ? a.allocate(act, {N, Htot, D}) : s.dqkv;
  s.dattn = a.allocate(act, {N, Hq * D});
  s.dgate_up = a.allocate(act, {N, 2 * F});
  s.dhidden = a.allocate(act, {N, F});
  return acts;
}

void Transformer::bind_activations(int64_t B, int64_t T) {
  acts_ = plan_activations(config_, recipe_, chunk_, recompute_, *activation_arena_, B, T);
  ++layout_version_;
  // inv_freq is constant: converted from float64 on the host.
  const std::vector<double> inv = rope_inverse_frequencies(config_);
  const std::vector<float> inv_f(inv.begin(), inv.end());
  if (acts_->inv_freq.dtype == DType::f64) copy_from_host(ctx_, acts_->inv_freq, inv.data());
  else copy_from_host(ctx_, acts_->inv_freq, inv_f.data());
}

Transformer::MemoryUse Transformer::estimate_memory(const ModelConfig& config, const Recipe& recipe,
                                                    int64_t micro_batch, int64_t seq_len, int64_t chunk,
                                                    Recompute recompute) {
  if (chunk <= 0) chunk = auto_chunk(micro_batch * seq_len, config.vocab_size);
  const int64_t P = total_numel(plan_parameters(config));
  Arena measuring("activations", Device::cpu);
  plan_activations(config, recipe, chunk, recompute, measuring, micro_batch, seq_len);
  return {P * dtype_size(recipe.param), P * dtype_size(recipe.grad), measuring.used()};
}

void Transformer::init_random(uint64_t seed) {
  // Each value is a pure function of (seed, parameter index, element index), so the result does not
  // depend on the thread count; written straight into a host buffer of the parameter dtype.
  const int64_t P = total_numel(entries_);
  const DType dtype = recipe_.param;
  std::vector<char> host(static_cast<size_t>(P * dtype_size(dtype)), 0);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const ParamEntry& e = entries_[i];
    const double std = config_.initializer_range;
#pragma omp parallel for num_threads(ctx_.num_threads) schedule(static)
    for (int64_t j = 0; j < e.numel; ++j) {
      double v = 0.0;
      if (e.init == ParamInit::ones) v = 1.0;
      else if (e.init == ParamInit::normal) v = std * normal01(seed, i, static_cast<uint64_t>(j));
      // transformers zeroes the padding row of the input embedding (a tied LM head shares it).
      if (e.kind == ParamKind::embedding && j / e.shape[1] == config_.pad_token_id) v = 0.0;
      char* dst = host.data() + (e.offset + j) * dtype_size(dtype);
      if (dtype == DType::f64) {
        std::memcpy(dst, &v, 8);
      } else if (dtype == DType::f32) {
        const float f = static_cast<float>(v);
        std::memcpy(dst, &f, 4);
      } else {
        const uint16_t h = f32_to_bf16(static_cast<float>(v));
        std::memcpy(dst, &h, 2);
      }
    }
  }
  copy_from_host(ctx_, weights_, host.data());
}

void Transformer::load_batch(const HostBatch& batch, int64_t tokens) {
  if (tokens < 0) tokens = B_ * T_;
  INGOT_CHECK(tokens == B_ * T_ || (B_ == 1 && tokens > 0 && tokens <= T_),
              "load_batch: ", tokens, " tokens do not fit micro-batch ", B_, " x ", T_);
  if (tokens != active_tokens_) {
    bind_activations(tokens == B_ * T_ ? B_ : 1, tokens == B_ * T_ ? T_ : tokens);
    active_tokens_ = tokens;
  }
  Activations& s = *acts_;
  copy_from_host(ctx_, s.input_ids, batch.input_ids);
  if (batch.targets) copy_from_host(ctx_, s.targets, batch.targets);
  copy_from_host(ctx_, s.positions, batch.positions);
  s.packed = batch.segment_ids != nullptr;
  if (s.packed) copy_from_host(ctx_, s.segment_ids, batch.segment_ids);
}

void Transformer::attention_inputs(int64_t l) {
  const ModelConfig& c = config_;
  Activations& s = *acts_;
  const int Hq = static_cast<int>(c.num_attention_heads), Hkv = static_cast<int>(c.num_key_value_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const LayerParams& p = params_.layers[l];
  Activations::Layer& L = s.layers[l];
  // attention(rope(qk_norm(qkv(rmsnorm(x)))))
  ops::rmsnorm_forward(ctx_, L.ln1, L.rstd1, s.residual[2 * l], p.input_norm, c.rms_norm_eps);
  ops::linear_forward(ctx_, L.qkv_raw.view({L.qkv_raw.dim(0), L.qkv_raw.dim(1) * L.qkv_raw.dim(2)}), L.ln1, p.qkv, p.qkv_bias);
  if (c.qk_norm)
    ops::qk_norm_forward(ctx_, L.qkv, L.qk_rstd, L.qkv_raw, p.q_norm, p.k_norm, Hq, Hkv, c.rms_norm_eps);
  ops::rope_forward(ctx_, L.qkv, s.positions, s.inv_freq, Hq + Hkv);
  const Tensor qkv4 = L.qkv.view({L.lse.dim(0), L.lse.dim(2), L.qkv.dim(1), L.qkv.dim(2)});
  const Tensor attn4 = L.attn.view({L.lse.dim(0), L.lse.dim(2), Hq, c.head_dim});
  ops::attention_forward(ctx_, attn4, L.lse, qkv4, s.packed ? s.segment_ids : Tensor(), Hq, Hkv, scale);
}

void Transformer::mlp_inputs(int64_t l) {
  const ModelConfig& c = config_;
  Activations& s = *acts_;
  const LayerParams& p = params_.layers[l];
  Activations::Layer& L = s.layers[l];
  // swiglu(gate_up(rmsnorm(x_mid)))
  ops::rmsnorm_forward(ctx_, L.ln2, L.rstd2, s.residual[2 * l + 1], p.post_norm, c.rms_norm_eps);
  ops::linear_forward(ctx_, L.gate_up, L.ln2, p.gate_up, Tensor());
  ops::swiglu_forward(ctx_, L.hidden, L.gate_up);
}

void Transformer::forward() {
  const ModelConfig& c = config_;
  Activations& s = *acts_;
  ops::embedding_forward(ctx_, s.residual[0], s.input_ids, params_.embed);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerParams& p = params_.layers[l];
    const Activations::Layer& L = s.layers[l];
    // x_mid = x + o(attention(...)); x_out = x_mid + down(swiglu(...)): the residual adds ride in the GEMMs.
    attention_inputs(l);
    ops::linear_forward(ctx_, s.residual[2 * l + 1], L.attn, p.o, Tensor(), s.residual[2 * l]);
    mlp_inputs(l);
    ops::linear_forward(ctx_, s.residual[2 * l + 2], L.hidden, p.down, Tensor(), s.residual[2 * l + 1]);
  }
  ops::rmsnorm_forward(ctx_, s.lnf, s.rstdf, s.residual.back(), params_.final_norm, c.rms_norm_eps);
}

// LM head + cross-entropy, chunk by chunk so (N,V) logits never exist at once. With backward,
// each chunk's dlogits (in place) immediately produce its share of d(lnf) and d(lm_head).
void Transformer::head_loss(double dloss_scale, bool with_backward, Tensor loss_sum, bool accumulate,
                            GradWrite grads) {
  Activations& s = *acts_;
  const int64_t N = s.lnf.dim(0);
  for (int64_t begin = 0; begin < N; begin += chunk_) {
    const int64_t end = std::min(N, begin + chunk_);
    const Tensor logits = s.logits.slice_rows(0, end - begin);
    const Tensor lnf = s.lnf.slice_rows(begin, end);
    ops::linear_forward(ctx_, logits, lnf, params_.lm_head, Tensor());
    ops::cross_entropy(ctx_, s.losses.slice_rows(begin, end), with_backward ? logits : Tensor(), logits,
                       s.targets.slice_rows(begin, end), dloss_scale);
    if (with_backward)
      ops::linear_backward(ctx_, s.dnormed.slice_rows(begin, end), param_grads_.lm_head, Tensor(), logits,
                           lnf, params_.lm_head, grads == GradWrite::accumulate || begin > 0);
  }
  ops::sum_to(ctx_, loss_sum, s.losses, accumulate);  // fixed order: deterministic
}

double Transformer::read_loss_sum() { return to_host_doubles(ctx_, acts_->loss_sum)[0]; }

void Transformer::reserve_staging(int64_t count, bool packed) {
  INGOT_CHECK(count >= 1, "reserve_staging: count ", count, " must be >= 1");
  const int64_t N = B_ * T_;
  staging_arena_ = std::make_unique<Arena>("input staging", ctx_.device);
  staging_arena_->reserve(count * 4 * N * 4 + Arena::kAlignment);
  staged_inputs_ = staging_arena_->allocate(DType::i32, {count, 4, N});
  ops::zero(ctx_, staged_inputs_);
  staged_packed_ = packed;
}

void Transformer::bind_full_batch() {
  if (active_tokens_ == B_ * T_) return;
  bind_activations(B_, T_);
  active_tokens_ = B_ * T_;
}

void Transformer::use_staged(int64_t micro) {
  INGOT_CHECK(staged_inputs_.present() && micro >= 0 && micro < staged_inputs_.dim(0), "use_staged: micro-batch ",
              micro, " is not staged");
  INGOT_CHECK(active_tokens_ == B_ * T_, "use_staged: the model is bound to a shorter input");
  Activations& s = *acts_;
  const int64_t N = B_ * T_;
  const Tensor rows = staged_inputs_.view({staged_inputs_.dim(0) * 4, N});
  ops::copy(ctx_, s.input_ids, rows.slice_rows(4 * micro, 4 * micro + 1).view({N}));
  ops::copy(ctx_, s.targets, rows.slice_rows(4 * micro + 1, 4 * micro + 2).view({N}));
  ops::copy(ctx_, s.positions, rows.slice_rows(4 * micro + 2, 4 * micro + 3).view({N}));
  s.packed = staged_packed_;
  if (s.packed) ops::copy(ctx_, s.segment_ids, rows.slice_rows(4 * micro + 3, 4 * micro + 4).view({B_, T_}));
}

void Transformer::backward(GradWrite grads) {
  const ModelConfig& c = config_;
  const bool add = grads == GradWrite::accumulate;  // the projections' weight gradients
  Activations& s = *acts_;
  const int Hq = static_cast<int>(c.num_attention_heads), Hkv = static_cast<int>(c.num_key_value_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const Tensor segments = s.packed ? s.segment_ids : Tensor();
  // d(lnf) is in dnormed (from head_loss); dresidual accumulates the residual stream's gradient.
  ops::zero(ctx_, s.dresidual);
  ops::rmsnorm_backward(ctx_, s.dresidual, param_grads_.final_norm, s.dnormed, s.residual.back(),
                        params_.final_norm, s.rstdf);
  for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) {
    // Shared buffers hold the last block's activations after the forward; earlier blocks are
    // recomputed from their stored inputs (same ops, same order: bitwise the same values).
    if (recompute_ == Recompute::block && l < c.num_hidden_layers - 1) {
      attention_inputs(l);
      mlp_inputs(l);
    }
    // elementwise: the shared buffers hold the last block's values; each is rewritten for block l
    // just before its consumer.
    const bool recompute_elementwise = recompute_ == Recompute::elementwise && l < c.num_hidden_layers - 1;
    const LayerParams& p = params_.layers[l];
    const LayerParams& g = param_grads_.layers[l];
    Activations::Layer& L = s.layers[l];
    // MLP half (dresidual = d x_out, which is also d of the skip path into x_mid)
    if (recompute_elementwise) ops::swiglu_forward(ctx_, L.hidden, L.gate_up);
    ops::linear_backward(ctx_, s.dhidden, g.down, Tensor(), s.dresidual, L.hidden, p.down, add);
    ops::swiglu_backward(ctx_, s.dgate_up, s.dhidden, L.gate_up);
    if (recompute_elementwise)
      ops::rmsnorm_forward(ctx_, L.ln2, L.rstd2, s.residual[2 * l + 1], p.post_norm, c.rms_norm_eps);
    ops::linear_backward(ctx_, s.dnormed, g.gate_up, Tensor(), s.dgate_up, L.ln2, p.gate_up, add);
    ops::rmsnorm_backward(ctx_, s.dresidual, g.post_norm, s.dnormed, s.residual[2 * l + 1], p.post_norm, L.rstd2);
    // attention half (dresidual = d x_mid)
    ops::linear_backward(ctx_, s.dattn, g.o, Tensor(), s.dresidual, L.attn, p.o, add);
    if (recompute_elementwise && c.qk_norm) {
      ops::qk_norm_forward(ctx_, L.qkv, L.qk_rstd, L.qkv_raw, p.q_norm, p.k_norm, Hq, Hkv, c.rms_norm_eps);
      ops::rope_forward(ctx_, L.qkv, s.positions, s.inv_freq, Hq + Hkv);
    }
    const Tensor qkv4 = L.qkv.view({L.lse.dim(0), L.lse.dim(2), L.qkv.dim(1), L.qkv.dim(2)});
    const Tensor dqkv4 = s.dqkv.view({L.lse.dim(0), L.lse.dim(2), L.qkv.dim(1), L.qkv.dim(2)});
    const Tensor attn4 = L.attn.view({L.lse.dim(0), L.lse.dim(2), Hq, c.head_dim});
    const Tensor dattn4 = s.dattn.view({L.lse.dim(0), L.lse.dim(2), Hq, c.head_dim});
    ops::attention_backward(ctx_, dqkv4, dattn4, attn4, L.lse, qkv4, segments, Hq, Hkv, scale);
    ops::rope_backward(ctx_, s.dqkv, s.positions, s.inv_freq, Hq + Hkv);
    if (c.qk_norm)
      ops::qk_norm_backward(ctx_, s.dqkv_raw, g.q_norm, g.k_norm, s.dqkv, L.qkv_raw, p.q_norm, p.k_norm,
                            L.qk_rstd, Hq, Hkv);
    const Tensor dqkv2 = s.dqkv_raw.view({s.dqkv_raw.dim(0), s.dqkv_raw.dim(1) * s.dqkv_raw.dim(2)});
    if (recompute_elementwise)
      ops::rmsnorm_forward(ctx_, L.ln1, L.rstd1, s.residual[2 * l], p.input_norm, c.rms_norm_eps);
    ops::linear_backward(ctx_, s.dnormed, g.qkv, g.qkv_bias, dqkv2, L.ln1, p.qkv, add);
    ops::rmsnorm_backward(ctx_, s.dresidual, g.input_norm, s.dnormed, s.residual[2 * l], p.input_norm, L.rstd1);
  }
  ops::embedding_backward(ctx_, param_grads_.embed, s.dresidual, s.input_ids, config_.pad_token_id);
}

double Transformer::forward_backward(double dloss_scale) {
  forward_backward_into(dloss_scale, acts_->loss_sum, false, GradWrite::accumulate);
  return read_loss_sum();
}

void Transformer::forward_backward_into(double dloss_scale, Tensor loss_sum, bool accumulate, GradWrite grads) {
  forward();
  if (grads == GradWrite::overwrite)
    for (const auto& [begin, end] : accumulated_only_) ops::zero(ctx_, grads_.slice_rows(begin, end));
  head_loss(dloss_scale, true, loss_sum, accumulate, grads);
  backward(grads);
}

double Transformer::forward_loss() {
  forward();
  head_loss(0.0, false, acts_->loss_sum, false);
  return read_loss_sum();
}

std::vector<double> Transformer::forward_logits() {
  forward();
  Activations& s = *acts_;
  const int64_t N = s.lnf.dim(0), V = config_.vocab_size;
  std::vector<double> all;
  all.reserve(static_cast<size_t>(N * V));
  for (int64_t begin = 0; begin < N; begin += chunk_) {
    const int64_t end = std::min(N, begin + chunk_);
    const Tensor logits = s.logits.slice_rows(0, end - begin);
    ops::linear_forward(ctx_, logits, s.lnf.slice_rows(begin, end), params_.lm_head, Tensor());
    const std::vector<double> part = to_host_doubles(ctx_, logits);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

std::vector<double> Transformer::forward_logits_at(int64_t row) {
  Activations& s = *acts_;
  const int64_t N = s.lnf.dim(0);
  INGOT_CHECK(row >= 0 && row < N, "forward_logits_at: row ", row, " outside the ", N, " loaded tokens");
  forward();
  const Tensor logits = s.logits.slice_rows(0, 1);
  ops::linear_forward(ctx_, logits, s.lnf.slice_rows(row, row + 1), params_.lm_head, Tensor());
  return to_host_doubles(ctx_, logits);
}

Transformer::MemoryUse Transformer::memory_use() const {
  return {param_arena_->capacity(), grad_arena_->capacity(), activation_arena_->capacity()};
}

}  // namespace ingot
