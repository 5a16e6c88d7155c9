"""Write a small random-weight Llama checkpoint that real vLLM loads: run it with the vLLM venv's
Python (it needs torch, safetensors and tokenizers).

    python tiny_model.py OUT_DIR [--shards 4] [--hidden 1024] [--layers 8] [--kv-scales]

bf16 weights split into safetensors shards with `model.safetensors.index.json`; shard files of
about 100 MB make vLLM's weights bar print every step. With `--kv-scales` every layer also gets
`k_scale`/`v_scale` tensors, which vLLM does not expect for this model and warns about.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--kv-scales", action="store_true")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    h, n_layers, vocab = args.hidden, args.layers, args.vocab
    heads = h // 64

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 2048,
            }
        )
    )
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": h,
                "intermediate_size": 4 * h,
                "num_hidden_layers": n_layers,
                "num_attention_heads": heads,
                "num_key_value_heads": heads,
                "vocab_size": vocab,
                "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "bfloat16",
                "bos_token_id": 1,
                "eos_token_id": 2,
                "tie_word_embeddings": False,
            }
        )
    )
    g = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    tensors: list[tuple[str, torch.Tensor]] = [("model.embed_tokens.weight", w(vocab, h))]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        tensors += [
            (p + "self_attn.q_proj.weight", w(h, h)),
            (p + "self_attn.k_proj.weight", w(h, h)),
            (p + "self_attn.v_proj.weight", w(h, h)),
            (p + "self_attn.o_proj.weight", w(h, h)),
            (p + "mlp.gate_proj.weight", w(4 * h, h)),
            (p + "mlp.up_proj.weight", w(4 * h, h)),
            (p + "mlp.down_proj.weight", w(h, 4 * h)),
            (p + "input_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)),
            (p + "post_attention_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)),
        ]
        if args.kv_scales:
            tensors += [
                (p + "self_attn.k_scale", torch.tensor(1.0)),
                (p + "self_attn.v_scale", torch.tensor(1.0)),
            ]
    tensors += [
        ("model.norm.weight", torch.ones(h, dtype=torch.bfloat16)),
        ("lm_head.weight", w(vocab, h)),
    ]
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    per = total / args.shards
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors:
        if size >= per * len(groups) and len(groups) < args.shards:
            groups.append({})
        groups[-1][name] = t
        size += t.numel() * t.element_size()
    weight_map = {}
    for i, group in enumerate(groups, 1):
        fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in group})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )


if __name__ == "__main__":
    main()
