#!/usr/bin/env python3
"""Build tiny random Hugging Face models in float64 and write the fixtures Ingot is tested against.

Usage:  python3 tools/make_hf_fixtures.py [--out tests/fixtures] [--arch llama qwen2 qwen3]

For each architecture it writes OUT/<arch>/{config.json, model.safetensors, expected.safetensors}.
The layout, hyperparameters and numerics are documented in tests/fixtures/README.md.

Stock transformers is NOT float64-exact even after model.double(): rotary cos/sin (and the llama3
inv_freq rule) are computed in float32, RMSNorm upcasts to float32, eager attention takes its softmax
in float32 and the causal-LM loss casts logits to float32. `patch_float64()` below replaces those four
places by float64 code (same formulas), so the fixtures are float64-exact. The script checks this by
comparing against an independent pure-torch float64 re-implementation (`reference_forward`).

`patch_float64`, `build_inv_freq` and `causal_lm_loss` are imported by tools/check_export.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import types

import torch
import torch.nn.functional as F

SEED = 1234
BATCH, SEQ = 2, 12
IGNORE_INDEX = -100
# (batch, position) pairs whose label is set to IGNORE_INDEX. (1, 0) is never a target after the shift
# (harmless, it tests that position 0 is dropped); the other two remove real targets.
IGNORED_LABELS = [(0, 5), (1, 0), (1, 9)]
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

# Tiny configs. Keys are passed to the transformers config class. rope_theta / rope_scaling are given
# in the legacy form that transformers 4.x and 5.x both accept (5.x folds them into rope_parameters).
ARCHS = {
    "llama": dict(
        cls="LlamaConfig", model_cls="LlamaForCausalLM",
        kwargs=dict(
            vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            attention_bias=False, mlp_bias=False, tie_word_embeddings=False, hidden_act="silu",
            initializer_range=0.02, bos_token_id=1, eos_token_id=2, pad_token_id=None,
        ),
    ),
    "qwen2": dict(
        cls="Qwen2Config", model_cls="Qwen2ForCausalLM",
        kwargs=dict(
            vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
            max_window_layers=2, hidden_act="silu", initializer_range=0.02,
            # 16 is at positions 10 and 11 of row 0 (the last position feeds no loss either way):
            # nn.Embedding(padding_idx=16) gives its row no gradient from the lookup, only from the
            # tied LM head.
            bos_token_id=1, eos_token_id=2, pad_token_id=16,
        ),
    ),
    "qwen3": dict(
        cls="Qwen3Config", model_cls="Qwen3ForCausalLM",
        kwargs=dict(
            vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
            attention_bias=False, tie_word_embeddings=True, use_sliding_window=False,
            sliding_window=None, max_window_layers=2, hidden_act="silu", initializer_range=0.02,
            bos_token_id=1, eos_token_id=2,
        ),
    ),
}


# ----------------------------------------------------------------------------------------------
# Config helpers (work with transformers 4.45+ `rope_theta`/`rope_scaling` and 5.x `rope_parameters`)
# ----------------------------------------------------------------------------------------------
def rope_settings(config) -> tuple[float, dict | None, int]:
    """Returns (theta, llama3 scaling dict or None, rotary dim) from a transformers config."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = params if params.get("rope_type", "default") != "default" else None
    else:
        theta = float(config.rope_theta)
        scaling = getattr(config, "rope_scaling", None)
        if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
    if scaling is not None:
        rtype = scaling.get("rope_type", scaling.get("type"))
        if rtype != "llama3":
            raise SystemExit(f"unsupported rope type {rtype!r} (only default and llama3)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if float(getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise SystemExit("partial_rotary_factor != 1 is not supported")
    return theta, scaling, head_dim


def build_inv_freq(theta: float, dim: int, scaling: dict | None) -> torch.Tensor:
    """float64 inverse frequencies: 1/theta^(2i/dim), i = 0..dim/2-1, then the llama3 rule."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float64) / dim
    inv_freq = 1.0 / (theta ** exponent)
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_ctx / low
    high_freq_wavelen = old_ctx / high
    out = []
    for f in inv_freq.tolist():
        wavelen = 2.0 * math.pi / f
        if wavelen > low_freq_wavelen:
            out.append(f / factor)
        elif wavelen < high_freq_wavelen:
            out.append(f)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append((1.0 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------------------------
# float64 patches
# ----------------------------------------------------------------------------------------------
def _rotary_forward_f64(self, x, position_ids):
    inv_freq = self._ingot_inv_freq_f64.to(x.device)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq        # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)                               # [B, T, D]
    scale = float(getattr(self, "attention_scaling", 1.0))
    return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)


def _rmsnorm_forward_f64(self, hidden_states):
    # Same formula as HF's *RMSNorm, without the float32 round trip.
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states


def _make_eager_attention_f64(repeat_kv):
    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        # HF's eager attention with the softmax taken in the input dtype instead of float32.
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights
    return eager_attention_forward


def patch_float64(model) -> dict:
    """Makes a HF Llama/Qwen2/Qwen3 CausalLM float64-exact (see module docstring). Returns what was
    patched. Requires attn_implementation == "eager". Patches the modeling module's global
    eager_attention_forward (process-wide for that architecture) and the model's own rotary and
    RMSNorm instances."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise SystemExit(f"patch_float64 needs attn_implementation='eager', got {impl!r}")
    modeling = sys.modules[type(model).__module__]
    if not hasattr(modeling, "eager_attention_forward") or not hasattr(modeling, "repeat_kv"):
        raise SystemExit(f"{modeling.__name__} has no eager_attention_forward/repeat_kv: "
                         "transformers too old (need >= 4.48) for the float64 patch")
    if not getattr(modeling.eager_attention_forward, "_ingot_f64", False):
        fn = _make_eager_attention_f64(modeling.repeat_kv)
        fn._ingot_f64 = True
        modeling.eager_attention_forward = fn

    theta, scaling, dim = rope_settings(model.config)
    rotary = model.model.rotary_emb
    rotary._ingot_inv_freq_f64 = build_inv_freq(theta, dim, scaling)
    rotary.forward = types.MethodType(_rotary_forward_f64, rotary)

    n_norm = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_rmsnorm_forward_f64, module)
            n_norm += 1
    return dict(inv_freq=rotary._ingot_inv_freq_f64, hf_inv_freq=rotary.inv_freq.detach().clone(),
                rms_norms=n_norm, attention=modeling.__name__ + ".eager_attention_forward")


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF ForCausalLMLoss in the logits' dtype: mean cross entropy of logits[:, t] against
    labels[:, t+1] over the targets that are not IGNORE_INDEX."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1, :].reshape(-1, v), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="mean")


# ----------------------------------------------------------------------------------------------
# Independent float64 reference (used only to verify the patched HF model)
# ----------------------------------------------------------------------------------------------
def reference_forward(params: dict, arch: str, cfg, input_ids: torch.Tensor, inv_freq: torch.Tensor):
    B, T = input_ids.shape
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    eps = cfg.rms_norm_eps

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x):  # x [B, H, T, D]; rotate_half convention (first half / second half)
        pos = torch.arange(T, dtype=torch.float64)
        ang = pos[:, None] * inv_freq[None, :]
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def lin(x, name):
        y = x @ params[name + ".weight"].T
        b = params.get(name + ".bias")
        return y + b if b is not None else y

    h = params["model.embed_tokens.weight"][input_ids]
    pad = getattr(cfg, "pad_token_id", None)
    if pad is not None:  # nn.Embedding's padding_idx: the lookup passes no gradient to that row
        h = torch.where((input_ids == pad)[..., None], h.detach(), h)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = rms(h, params[p + "input_layernorm.weight"])
        q = lin(x, p + "self_attn.q_proj").view(B, T, Hq, D)
        k = lin(x, p + "self_attn.k_proj").view(B, T, Hkv, D)
        v = lin(x, p + "self_attn.v_proj").view(B, T, Hkv, D)
        if arch == "qwen3":
            q = rms(q, params[p + "self_attn.q_norm.weight"])
            k = rms(k, params[p + "self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~causal, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, Hq * D)
        h = h + lin(a, p + "self_attn.o_proj")
        x = rms(h, params[p + "post_attention_layernorm.weight"])
        g = lin(x, p + "mlp.gate_proj")
        u = lin(x, p + "mlp.up_proj")
        h = h + lin(F.silu(g) * u, p + "mlp.down_proj")
    h = rms(h, params["model.norm.weight"])
    head = params.get("lm_head.weight", params["model.embed_tokens.weight"])
    return h @ head.T


# ----------------------------------------------------------------------------------------------
def build_model(arch: str):
    import transformers
    spec = ARCHS[arch]
    config = getattr(transformers, spec["cls"])(**spec["kwargs"])
    config.architectures = [spec["model_cls"]]
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = getattr(transformers, spec["model_cls"])(config).double().eval()  # eval: no dropout
    model.config._attn_implementation = "eager"

    # Deterministic non-trivial init of every parameter, in named_parameters() order.
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("norm.weight"):      # RMSNorm gains (incl. qwen3 q_norm/k_norm)
                p.copy_(1.0 + 0.1 * noise)
            else:                                  # matrices, embeddings, biases
                p.copy_(0.1 * noise)
    return config, model


def make_inputs(vocab: int):
    gen = torch.Generator().manual_seed(SEED + 1)
    input_ids = torch.randint(0, vocab, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    labels = input_ids.clone()
    for b, t in IGNORED_LABELS:
        labels[b, t] = IGNORE_INDEX
    return input_ids, labels


def write_config(config, path: str):
    """config.json as transformers writes it, plus the legacy rope_theta / rope_scaling keys (the
    form found on the Hub, readable by transformers 4.x and 5.x) when this version omits them."""
    config.save_pretrained(os.path.dirname(path))
    with open(path) as f:
        data = json.load(f)
    theta, scaling, _ = rope_settings(config)
    data.setdefault("rope_theta", theta)
    if scaling is not None and not data.get("rope_scaling"):
        data["rope_scaling"] = {k: scaling[k] for k in ("rope_type", "factor", "low_freq_factor",
                                                         "high_freq_factor", "original_max_position_embeddings")}
    data["torch_dtype"] = "float64"   # transformers 4.x key
    data["dtype"] = "float64"         # transformers 5.x key
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def generate(arch: str, out_root: str) -> None:
    import transformers
    from safetensors.torch import save_file

    out = os.path.join(out_root, arch)
    os.makedirs(out, exist_ok=True)
    config, model = build_model(arch)
    input_ids, labels = make_inputs(config.vocab_size)
    tied = bool(config.tie_word_embeddings)

    # Unpatched HF outputs, kept to show what the patch changes.
    with torch.no_grad():
        pos = torch.arange(SEQ)[None, :].expand(BATCH, SEQ)
        dummy = torch.zeros(1, dtype=torch.float64)
        cos_hf, sin_hf = model.model.rotary_emb(dummy, pos)
        logits_hf = model(input_ids=input_ids, use_cache=False).logits.detach().clone()

    info = patch_float64(model)
    with torch.no_grad():
        cos64, sin64 = model.model.rotary_emb(dummy, pos)
    d_inv = (info["inv_freq"] - info["hf_inv_freq"].double()).abs().max().item()
    d_cs = max((cos64 - cos_hf).abs().max().item(), (sin64 - sin_hf).abs().max().item())
    print(f"[{arch}] transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"[{arch}] inv_freq f64 = {[f'{v:.6g}' for v in info['inv_freq'].tolist()]}")
    print(f"[{arch}] patch: {info['rms_norms']} RMSNorms, {info['attention']}; "
          f"|inv_freq f64 - HF f32| max {d_inv:.3e}, |cos/sin f64 - HF| max {d_cs:.3e}")
    if not (0 < d_cs < 1e-5) or cos64.dtype != torch.float64:
        raise SystemExit(f"[{arch}] rotary patch did not take effect (diff {d_cs})")

    # Forward + backward in float64.
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=input_ids, use_cache=False).logits
    loss = causal_lm_loss(logits, labels)
    loss.backward()
    d_logits_patch = (logits.detach() - logits_hf).abs().max().item()
    print(f"[{arch}] |logits patched - unpatched HF| max {d_logits_patch:.3e}")
    if not d_logits_patch > 0:
        raise SystemExit(f"[{arch}] float64 patch changed nothing")

    # HF's own loss path (float32 upcast) for comparison: should agree to ~1e-7.
    with torch.no_grad():
        loss_hf = model(input_ids=input_ids, labels=labels, use_cache=False).loss
    print(f"[{arch}] loss f64 {loss.item():.15f}, HF labels= path {loss_hf.item():.15f} "
          f"(diff {abs(loss.item() - loss_hf.item()):.2e})")
    if abs(loss.item() - loss_hf.item()) > 1e-5:
        raise SystemExit(f"[{arch}] loss disagrees with HF's labels= loss")

    # Independent float64 reference: logits and gradients.
    names = [n for n, _ in model.named_parameters()]
    ref_params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    ref_logits = reference_forward(ref_params, arch, config, input_ids, info["inv_freq"])
    ref_loss = causal_lm_loss(ref_logits, labels)
    ref_loss.backward()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()
    d_ref_logits = (ref_logits.detach() - logits.detach()).abs().max().item()
    d_ref_grad = max(rel(ref_params[n].grad, p.grad) for n, p in model.named_parameters())
    print(f"[{arch}] vs independent f64 reference: logits max abs {d_ref_logits:.3e}, "
          f"loss diff {abs(ref_loss.item() - loss.item()):.3e}, worst grad rel {d_ref_grad:.3e}")
    if d_ref_logits > 1e-12 or d_ref_grad > 1e-11:
        raise SystemExit(f"[{arch}] patched HF model is not float64-exact")

    # Weights (before the step), HF names. Tied models: named_parameters() / HF checkpoints omit lm_head.
    state = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    if tied:
        assert "lm_head.weight" not in state
    else:
        assert "lm_head.weight" in state
    grads = {f"grad.{n}": p.grad.detach().clone().contiguous() for n, p in model.named_parameters()}

    # One AdamW step; weight decay on every parameter (norm gains, biases and embeddings included).
    params = [p for _, p in model.named_parameters()]
    opt = torch.optim.AdamW(params, foreach=False, fused=False, **ADAMW)
    opt.step()
    adamw = {f"adamw.{n}": p.detach().clone().contiguous() for n, p in model.named_parameters()}

    # Independent check of the AdamW step-1 formula.
    lr, (b1, b2), eps, wd = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
    worst = 0.0
    for n in names:
        w, g = state[n], grads[f"grad.{n}"]
        m, v = (1 - b1) * g, (1 - b2) * g * g
        denom = v.sqrt() / math.sqrt(1 - b2) + eps
        expect = w * (1 - lr * wd) - (lr / (1 - b1)) * m / denom
        worst = max(worst, (expect - adamw[f"adamw.{n}"]).abs().max().item())
    print(f"[{arch}] AdamW formula vs torch: max abs {worst:.3e}")
    if worst > 1e-15:
        raise SystemExit(f"[{arch}] AdamW step does not match the documented formula")

    expected = {"input_ids": input_ids.contiguous(), "labels": labels.contiguous(),
                "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1).contiguous()}
    expected.update(grads)
    expected.update(adamw)
    # A single metadata key: safetensors writes a multi-key __metadata__ map in hash order.
    meta = {"format": "pt"}

    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(expected, os.path.join(out, "expected.safetensors"), metadata=meta)
    write_config(config, os.path.join(out, "config.json"))

    # The written config must load back to the same architecture and RoPE.
    cfg2 = transformers.AutoConfig.from_pretrained(out)
    t2, s2, d2 = rope_settings(cfg2)
    if not torch.equal(build_inv_freq(t2, d2, s2), info["inv_freq"]) or cfg2.model_type != config.model_type:
        raise SystemExit(f"[{arch}] config.json does not load back identically")

    for fn in ("config.json", "model.safetensors", "expected.safetensors"):
        with open(os.path.join(out, fn), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        print(f"[{arch}] wrote {fn} ({os.path.getsize(os.path.join(out, fn))} bytes, sha256 {digest})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    ap.add_argument("--arch", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)   # bitwise-reproducible CPU reductions
    for arch in args.arch:
        generate(arch, os.path.normpath(args.out))


if __name__ == "__main__":
    main()
