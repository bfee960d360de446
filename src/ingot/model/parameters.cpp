#include "ingot/model/parameters.h"

#include <map>

#include "ingot/core/error.h"

namespace ingot {

std::vector<ParamEntry> plan_parameters(const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.intermediate_size, D = c.head_dim, V = c.vocab_size;
  const int64_t q_rows = c.num_attention_heads * D, kv_rows = c.num_key_value_heads * D;
  std::vector<ParamEntry> entries;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamKind kind, ParamInit init,
                 std::vector<HfPiece> pieces) {
    ParamEntry e;
    e.name = std::move(name);
    e.shape = std::move(shape);
    e.numel = 1;
    for (int64_t d : e.shape) e.numel *= d;
    e.kind = kind;
    e.init = init;
    e.pieces = std::move(pieces);
    e.offset = offset;
    offset = e.slot_end();
    entries.push_back(std::move(e));
  };
  add("embed", {V, C}, ParamKind::embedding, ParamInit::normal, {{"model.embed_tokens.weight", 0, V}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string n = "layers." + std::to_string(l) + ".";
    add(n + "input_norm", {C}, ParamKind::norm, ParamInit::ones, {{p + "input_layernorm.weight", 0, C}});
    add(n + "qkv", {q_rows + 2 * kv_rows, C}, ParamKind::matrix, ParamInit::normal,
        {{p + "self_attn.q_proj.weight", 0, q_rows},
         {p + "self_attn.k_proj.weight", q_rows, q_rows + kv_rows},
         {p + "self_attn.v_proj.weight", q_rows + kv_rows, q_rows + 2 * kv_rows}});
    if (c.attention_bias)
      add(n + "qkv_bias", {q_rows + 2 * kv_rows}, ParamKind::bias, ParamInit::zeros,
          {{p + "self_attn.q_proj.bias", 0, q_rows},
           {p + "self_attn.k_proj.bias", q_rows, q_rows + kv_rows},
           {p + "self_attn.v_proj.bias", q_rows + kv_rows, q_rows + 2 * kv_rows}});
    if (c.qk_norm) {
      add(n + "q_norm", {D}, ParamKind::norm, ParamInit::ones, {{p + "self_attn.q_norm.weight", 0, D}});
      add(n + "k_norm", {D}, ParamKind::norm, ParamInit::ones, {{p + "self_attn.k_norm.weight", 0, D}});
    }
    add(n + "o", {C, q_rows}, ParamKind::matrix, ParamInit::normal, {{p + "self_attn.o_proj.weight", 0, C}});
    add(n + "post_norm", {C}, ParamKind::norm, ParamInit::ones, {{p + "post_attention_layernorm.weight", 0, C}});
    add(n + "gate_up", {2 * F, C}, ParamKind::matrix, ParamInit::normal,
        {{p + "mlp.gate_proj.weight", 0, F}, {p + "mlp.up_proj.weight", F, 2 * F}});
    add(n + "down", {C, F}, ParamKind::matrix, ParamInit::normal, {{p + "mlp.down_proj.weight", 0, C}});
  }
  add("final_norm", {C}, ParamKind::norm, ParamInit::ones, {{"model.norm.weight", 0, C}});
  if (!c.tie_word_embeddings)
    add("lm_head", {V, C}, ParamKind::matrix, ParamInit::normal, {{"lm_head.weight", 0, V}});
  return entries;
}

int64_t total_numel(const std::vector<ParamEntry>& entries) {
  if (entries.empty()) return 0;
  return entries.back().slot_end();
}

Tensor param_view(const Tensor& flat, const ParamEntry& entry) {
  Tensor t = flat;
  t.data = static_cast<char*>(flat.data) + entry.offset * dtype_size(flat.dtype);
  t.ndim = static_cast<int>(entry.shape.size());
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = entry.shape[i];
  return t;
}

ModelParams bind_params(const ModelConfig& c, const std::vector<ParamEntry>& entries, const Tensor& flat) {
  std::map<std::string, Tensor> by_name;
  for (const ParamEntry& e : entries) by_name[e.name] = param_view(flat, e);
  auto get = [&](const std::string& name) -> Tensor {
    auto it = by_name.find(name);
    return it == by_name.end() ? Tensor() : it->second;
  };
  ModelParams p;
  p.embed = get("embed");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string n = "layers." + std::to_string(l) + ".";
    LayerParams lp;
    lp.input_norm = get(n + "input_norm");
    lp.qkv = get(n + "qkv");
    lp.qkv_bias = get(n + "qkv_bias");
    lp.q_norm = get(n + "q_norm");
    lp.k_norm = get(n + "k_norm");
    lp.o = get(n + "o");
    lp.post_norm = get(n + "post_norm");
    lp.gate_up = get(n + "gate_up");
    lp.down = get(n + "down");
    p.layers.push_back(lp);
  }
  p.final_norm = get("final_norm");
  p.lm_head = c.tie_word_embeddings ? p.embed : get("lm_head");
  return p;
}

}  // namespace ingot
