"""Model shapes for the speed benchmark, and the FLOPs/MFU arithmetic of ../shared/DESIGN.md.

No torch here: run.sh uses this module to write config.json files and to build the results table
without importing torch. Each preset is the config.json that transformers would read for that
public model (same architecture, random weights); the Ingot side reads the identical file.
"""
import json
import os

# Dense BF16 peak of an H100/H200 SXM (DESIGN.md, "Measuring speed").
PEAK_FLOPS = 989.4e12

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

PRESETS = {
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": dict(_LLAMA3_ROPE),
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": 128000, "eos_token_id": 128001, "use_cache": False,
    },
    # Qwen/Qwen3-0.6B
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": 151643, "eos_token_id": 151645, "use_cache": False,
    },
    # Qwen/Qwen2.5-0.5B (q, k and v carry biases; Qwen2 always has them)
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
        "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_dropout": 0.0, "use_sliding_window": False,
        "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": 151643, "eos_token_id": 151643, "use_cache": False,
    },
    # meta-llama/Meta-Llama-3-8B
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": False, "initializer_range": 0.02,
        "bos_token_id": 128000, "eos_token_id": 128001, "use_cache": False,
    },
    # Small shapes of each architecture, for testing the scripts on a CPU.
    "tiny": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": dict(_LLAMA3_ROPE, original_max_position_embeddings=256),
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "use_cache": False,
    },
    "tiny-qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "use_cache": False,
    },
    "tiny-qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_dropout": 0.0, "use_sliding_window": False,
        "tie_word_embeddings": False, "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "use_cache": False,
    },
}

# Parameter counts of the public checkpoints (all parameters, tied embeddings counted once), for
# checking the shapes above: bench/peers.py --check compares them with a model built on "meta".
PUBLIC_PARAM_COUNTS = {
    "llama-3.2-1b": 1_235_814_400,
    "qwen3-0.6b": 596_049_920,
    "qwen2.5-0.5b": 494_032_768,
    "llama-3-8b": 8_030_261_248,
}


def get(name):
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def load(name_or_dir):
    """A preset name, a directory holding config.json, or a config.json path."""
    if name_or_dir in PRESETS:
        return get(name_or_dir)
    path = os.path.join(name_or_dir, "config.json") if os.path.isdir(name_or_dir) else name_or_dir
    with open(path) as f:
        return json.load(f)


def write_config(name, directory):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "config.json")
    with open(path, "w") as f:
        json.dump(get(name), f, indent=2)
        f.write("\n")
    return path


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def n_matmul(cfg):
    """Every weight that enters a matmul: q, k, v, o, gate, up, down per layer, plus the LM head
    (V x C, tied or not). Embedding lookups, norms and biases are excluded."""
    c, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, dh = cfg["num_attention_heads"], head_dim(cfg)
    kv = cfg.get("num_key_value_heads") or h
    per_layer = c * h * dh + 2 * c * kv * dh + h * dh * c + 3 * c * i
    return cfg["num_hidden_layers"] * per_layer + v * c


def flops_per_token(cfg, seq):
    """6*N_matmul + 6*L*S*H*Dh: forward+backward of the weight matmuls, plus causal attention
    (QK^T and PV, 2 matmuls x 2 FLOPs x 3 for fwd+bwd, halved for the causal mask)."""
    return 6 * n_matmul(cfg) + 6 * cfg["num_hidden_layers"] * seq * cfg["num_attention_heads"] * head_dim(cfg)


def mfu(cfg, seq, tokens_per_s, peak=PEAK_FLOPS):
    return tokens_per_s * flops_per_token(cfg, seq) / peak


def flops_per_token_attending(cfg, mean_keys):
    """The same with the attention term over the (query, key) pairs that attend, as `ingot bench
    --packed-doc-len` counts it: 6*N_matmul + 12*L*H*Dh*mean_keys."""
    return 6 * n_matmul(cfg) + 12 * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * head_dim(cfg) * mean_keys


_M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def packed_positions(rows, seq, mean_doc_len):
    """Positions of rows packed with documents, the layout `ingot bench --packed-doc-len` builds (the
    same draws, so both sides train on the same documents): lengths uniform in 1..2N-1, back to back,
    the last cut at the row's end; positions restart at 0 with each document."""
    out, draw = [], 0
    for _ in range(rows):
        row, left, pos = [], 0, 0
        for _ in range(seq):
            if left == 0:
                left = 1 + _splitmix64(~draw & _M64) % (2 * mean_doc_len - 1)
                draw += 1
                pos = 0
            left -= 1
            row.append(pos)
            pos += 1
        out.append(row)
    return out


if __name__ == "__main__":
    for name, cfg in PRESETS.items():
        print(f"{name:14s} N_matmul {n_matmul(cfg) / 1e6:9.1f}M  FLOPs/token@4096 {flops_per_token(cfg, 4096) / 1e9:7.3f}G")
