"""The shapes in config.json that decide GPU memory, and which weight groups the index names.

What vLLM reads (checked against vLLM 0.32's model config and model files):

- Multimodal wrappers (Kimi-K2.5) keep the language model in ``text_config``; the KV cache and
  the layers are the language model's.
- ``num_key_value_heads`` missing means multi-head attention (one KV head per query head);
  ``head_dim`` missing means ``hidden_size // num_attention_heads``.
- MLA: a non-null ``kv_lora_rank``; the cache holds one latent of ``kv_lora_rank +
  qk_rope_head_dim`` per token and layer.
- ``layer_types`` (Gemma-3, Qwen3-Next, GPT-OSS, ...) tells full, sliding-window and linear
  (recurrent state, no per-token KV) layers apart; without it every layer is full attention,
  or sliding when ``sliding_window`` is set and ``use_sliding_window`` is not false.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from loadwatch.daemon.sources.inputs import ModelGeometry

# Weight groups placed differently from the rest, named by a fragment of the tensor name.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("embed_tokens", "embed_tokens."),
    ("lm_head", "lm_head."),
    ("mla_latent", "kv_a_proj_with_mqa."),
    ("mla_q_latent", "q_a_proj."),
    ("router", "mlp.gate.weight"),
    ("experts", ".experts."),
)


# More layers than any model has: a larger count is not a model's, and one tuple entry per
# layer (the layer types) must stay small.
MAX_LAYERS = 1 << 16


def _int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def layer_count(text: Mapping[str, Any]) -> int | None:
    """``num_hidden_layers``, None when absent or beyond `MAX_LAYERS`."""
    layers = _int(text, "num_hidden_layers")
    return layers if layers is not None and layers <= MAX_LAYERS else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def _layer_types(text: Mapping[str, Any], layers: int | None) -> tuple[str, ...]:
    raw = text.get("layer_types")
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return tuple(raw)
    window = _int(text, "sliding_window")
    if layers and window and text.get("use_sliding_window", True) is not False:
        return ("sliding_attention",) * layers
    return ()


def index_families(tensor_names: Iterable[str]) -> tuple[str, ...]:
    names = list(tensor_names)
    return tuple(fam for fam, frag in FAMILIES if any(frag in n for n in names))


def read_geometry(config: Mapping[str, Any], tensor_names: Iterable[str] = ()) -> ModelGeometry:
    text = text_config(config)
    layers = layer_count(text)
    heads = _int(text, "num_attention_heads")
    hidden = _int(text, "hidden_size")
    kv_heads = _int(text, "num_key_value_heads")
    head_dim = _int(text, "head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    kv_lora = _int(text, "kv_lora_rank")
    if kv_lora is None:
        kv_lora = _int(config, "kv_lora_rank")
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
    return ModelGeometry(
        num_layers=layers,
        layer_types=_layer_types(text, layers),
        num_attention_heads=heads,
        num_kv_heads=kv_heads if kv_heads is not None else heads,
        head_dim=head_dim,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=_int(text, "qk_rope_head_dim"),
        q_lora_rank=_int(text, "q_lora_rank"),
        hidden_size=hidden,
        vocab_size=_int(text, "vocab_size"),
        torch_dtype=dtype if isinstance(dtype, str) else None,
        max_position_embeddings=_int(text, "max_position_embeddings"),
        sliding_window=_int(text, "sliding_window"),
        n_routed_experts=_int(text, "n_routed_experts") or _int(text, "num_experts"),
        moe_intermediate_size=_int(text, "moe_intermediate_size"),
        first_k_dense_replace=_int(text, "first_k_dense_replace"),
        tie_word_embeddings=bool(
            text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
        ),
        index_families=index_families(tensor_names),
    )
