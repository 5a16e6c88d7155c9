"""Tiny random-weight checkpoints that real vLLM loads and serves on the CPU.

Two families:

- ``deepseek``: ``DeepseekV3ForCausalLM`` (MLA attention + MoE, the family of DeepSeek-V3 and
  Kimi-K2.x). vLLM's CPU MLA kernel wants ``kv_lora_rank`` 512 and ``qk_rope_head_dim`` 64; the
  rest is small.
- ``llama``: ``LlamaForCausalLM`` with a head size of 64 (vLLM's CPU attention needs >= 32).

Weights are bf16 (norms 1.0, everything else small random values), split into ``shards``
safetensors files of about ``shard_mb`` MB each, with ``model.safetensors.index.json``. The
safetensors files are written here byte by byte (an 8-byte header length, a JSON header, raw
little-endian data), so the weights need only the standard library and a 1.2 GB checkpoint takes
a few seconds. The tokenizer (byte-level BPE, trained on generated text) needs the ``tokenizers``
package, which the vLLM environment has; run this file with that environment's python.

Options that mimic real checkpoints:

- ``kv_scales``: ``model.layers.N.self_attn.k_scale`` / ``v_scale`` (F32 scalars) in every layer,
  as FP8-calibrated exports carry. vLLM finds no parameter for them in an MLA model and warns
  ``Found k_scale in the checkpoint (e.g. ...) ... k_scale is not loaded.``, once per layer.
- ``fp8_kv_decl``: an ``hf_quant_config.json`` (ModelOpt's legacy file) that declares an FP8 KV
  cache. ``quant_algo`` picks how: ``None`` (JSON null) is what a KV-only export writes, and vLLM
  0.32 ignores the whole file then; ``"FP8"`` with every module excluded from weight quantization
  makes vLLM take the FP8 KV cache dtype from the checkpoint while the bf16 weights load as they
  are.

Everything is deterministic for a given seed: building twice gives identical files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Arch = Literal["deepseek", "llama"]
DType = Literal["BF16", "F32"]
Fill = Literal["random", "ones", "zeros"]

MB = 1_000_000
DTYPE_BYTES: dict[DType, int] = {"BF16": 2, "F32": 4}
BF16_ONE = b"\x80\x3f"
F32_ONE = b"\x00\x00\x80\x3f"
VOCAB_SIZE = 2048
# Random bf16 values come from this many bytes of pool, read at a random rotation per tensor.
_POOL_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of the checkpoint: its name, shape, dtype and how to fill it."""

    name: str
    shape: tuple[int, ...]
    dtype: DType = "BF16"
    fill: Fill = "random"

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True, slots=True)
class Shard:
    """One safetensors file and the tensors it holds, in file order."""

    file_name: str
    tensors: tuple[TensorSpec, ...]

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """What to build. Sizes are targets: the result lands within a few per cent of them."""

    arch: Arch = "deepseek"
    shards: int = 12
    shard_mb: float = 100.0
    layers: int | None = None  # None: 12 for deepseek, 4 for llama
    kv_scales: bool = False
    fp8_kv_decl: bool = False
    fp8_quant_algo: str | None = "FP8"
    seed: int = 1234

    def num_layers(self) -> int:
        if self.layers is not None:
            return self.layers
        return 12 if self.arch == "deepseek" else 4


@dataclass(frozen=True, slots=True)
class BuiltModel:
    """What :func:`build_model` wrote."""

    path: Path
    arch: Arch
    config: dict[str, object]
    shard_files: tuple[Path, ...]
    shard_sizes_bytes: tuple[int, ...]
    total_size_bytes: int  # metadata.total_size: tensor data, headers not counted
    num_layers: int
    vocab_size: int
    build_s: float
    extra_files: tuple[str, ...] = field(default=())


# -- architectures ------------------------------------------------------------------------------


def _deepseek_config(opts: BuildOptions, moe_intermediate: int, vocab: int) -> dict[str, object]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 2048,
        "kv_lora_rank": 512,
        "max_position_embeddings": 4096,
        "moe_intermediate_size": moe_intermediate,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 16,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 8,
        "num_experts_per_tok": 4,
        "num_hidden_layers": opts.num_layers(),
        "num_key_value_heads": 8,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": 256,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 50000.0,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": 128,
        "vocab_size": vocab,
    }


def _deepseek_tensors(cfg: dict[str, object], kv_scales: bool) -> list[TensorSpec]:
    h = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    q_rank = _int(cfg, "q_lora_rank")
    kv_rank = _int(cfg, "kv_lora_rank")
    nope, rope, v_dim = (
        _int(cfg, "qk_nope_head_dim"),
        _int(cfg, "qk_rope_head_dim"),
        _int(cfg, "v_head_dim"),
    )
    experts = _int(cfg, "n_routed_experts")
    moe_i = _int(cfg, "moe_intermediate_size")
    shared_i = moe_i * _int(cfg, "n_shared_experts")
    dense_i = _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
    out = [TensorSpec("model.embed_tokens.weight", (vocab, h))]
    for i in range(_int(cfg, "num_hidden_layers")):
        p = f"model.layers.{i}"
        out += [
            TensorSpec(f"{p}.input_layernorm.weight", (h,), fill="ones"),
            TensorSpec(f"{p}.self_attn.q_a_proj.weight", (q_rank, h)),
            TensorSpec(f"{p}.self_attn.q_a_layernorm.weight", (q_rank,), fill="ones"),
            TensorSpec(f"{p}.self_attn.q_b_proj.weight", (heads * (nope + rope), q_rank)),
            TensorSpec(f"{p}.self_attn.kv_a_proj_with_mqa.weight", (kv_rank + rope, h)),
            TensorSpec(f"{p}.self_attn.kv_a_layernorm.weight", (kv_rank,), fill="ones"),
            TensorSpec(f"{p}.self_attn.kv_b_proj.weight", (heads * (nope + v_dim), kv_rank)),
            TensorSpec(f"{p}.self_attn.o_proj.weight", (h, heads * v_dim)),
        ]
        if kv_scales:
            out += [
                TensorSpec(f"{p}.self_attn.k_scale", (), "F32", "ones"),
                TensorSpec(f"{p}.self_attn.v_scale", (), "F32", "ones"),
            ]
        out.append(TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), fill="ones"))
        if i < _int(cfg, "first_k_dense_replace"):
            out += _mlp(f"{p}.mlp", h, dense_i)
            continue
        out += [
            TensorSpec(f"{p}.mlp.gate.weight", (experts, h)),
            TensorSpec(f"{p}.mlp.gate.e_score_correction_bias", (experts,), "F32", "zeros"),
        ]
        for e in range(experts):
            out += _mlp(f"{p}.mlp.experts.{e}", h, moe_i)
        out += _mlp(f"{p}.mlp.shared_experts", h, shared_i)
    out += [
        TensorSpec("model.norm.weight", (h,), fill="ones"),
        TensorSpec("lm_head.weight", (vocab, h)),
    ]
    return out


def _llama_config(opts: BuildOptions, intermediate: int, vocab: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "num_attention_heads": 4,
        "num_hidden_layers": opts.num_layers(),
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
    }


def _llama_tensors(cfg: dict[str, object], kv_scales: bool) -> list[TensorSpec]:
    h = _int(cfg, "hidden_size")
    hd = _int(cfg, "head_dim")
    q_dim = _int(cfg, "num_attention_heads") * hd
    kv_dim = _int(cfg, "num_key_value_heads") * hd
    inter = _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
    out = [TensorSpec("model.embed_tokens.weight", (vocab, h))]
    for i in range(_int(cfg, "num_hidden_layers")):
        p = f"model.layers.{i}"
        out += [
            TensorSpec(f"{p}.input_layernorm.weight", (h,), fill="ones"),
            TensorSpec(f"{p}.self_attn.q_proj.weight", (q_dim, h)),
            TensorSpec(f"{p}.self_attn.k_proj.weight", (kv_dim, h)),
            TensorSpec(f"{p}.self_attn.v_proj.weight", (kv_dim, h)),
            TensorSpec(f"{p}.self_attn.o_proj.weight", (h, q_dim)),
        ]
        if kv_scales:
            out += [
                TensorSpec(f"{p}.self_attn.k_scale", (), "F32", "ones"),
                TensorSpec(f"{p}.self_attn.v_scale", (), "F32", "ones"),
            ]
        out.append(TensorSpec(f"{p}.post_attention_layernorm.weight", (h,), fill="ones"))
        out += _mlp(f"{p}.mlp", h, inter)
    out += [
        TensorSpec("model.norm.weight", (h,), fill="ones"),
        TensorSpec("lm_head.weight", (vocab, h)),
    ]
    return out


def _mlp(prefix: str, hidden: int, inter: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}.gate_proj.weight", (inter, hidden)),
        TensorSpec(f"{prefix}.up_proj.weight", (inter, hidden)),
        TensorSpec(f"{prefix}.down_proj.weight", (hidden, inter)),
    ]


def _int(cfg: dict[str, object], key: str) -> int:
    value = cfg[key]
    assert isinstance(value, int), key
    return value


def plan(opts: BuildOptions, vocab: int = VOCAB_SIZE) -> tuple[dict[str, object], list[TensorSpec]]:
    """The config and tensor list whose total comes nearest ``shards * shard_mb`` MB.

    The size is tuned through the one width that scales the bulk of the weights (the MoE
    experts' intermediate size, or the MLP's for llama): bytes grow linearly in it, so two
    probes give the slope.
    """
    make_cfg = _deepseek_config if opts.arch == "deepseek" else _llama_config
    make_tensors = _deepseek_tensors if opts.arch == "deepseek" else _llama_tensors

    def total(width: int) -> int:
        return sum(t.nbytes for t in make_tensors(make_cfg(opts, width, vocab), opts.kv_scales))

    base, slope = total(0), total(1) - total(0)
    target = opts.shards * opts.shard_mb * MB
    step = 16
    width = max(step, round((target - base) / slope / step) * step)
    cfg = make_cfg(opts, width, vocab)
    return cfg, make_tensors(cfg, opts.kv_scales)


def split_shards(tensors: list[TensorSpec], shards: int) -> list[Shard]:
    """Consecutive runs of tensors of about equal bytes; a tensor goes where its middle falls."""
    total = sum(t.nbytes for t in tensors)
    per = total / shards
    groups: list[list[TensorSpec]] = [[] for _ in range(shards)]
    pos = 0
    for t in tensors:
        index = min(shards - 1, int((pos + t.nbytes / 2) / per))
        groups[index].append(t)
        pos += t.nbytes
    kept = [g for g in groups if g]
    n = len(kept)
    return [
        Shard(f"model-{i + 1:05d}-of-{n:05d}.safetensors", tuple(g)) for i, g in enumerate(kept)
    ]


# -- writing ------------------------------------------------------------------------------------


class _Filler:
    """Deterministic tensor bytes: bf16 values of magnitude 2^-9 .. 2^-5 with random signs."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        pool = bytearray(self._rng.randbytes(_POOL_BYTES))
        # The high byte of a little-endian bf16 holds the sign and the top 7 exponent bits.
        # Exponent 118..121 (from 0x3B/0x3C and the low byte's top bit) keeps values small and
        # finite.
        high = bytes((b & 0x80) | (0x3B + (b & 1)) for b in range(256))
        pool[1::2] = pool[1::2].translate(high)
        self._pool = bytes(pool)

    def data(self, spec: TensorSpec) -> bytes:
        n = spec.nbytes
        count = n // DTYPE_BYTES[spec.dtype]
        if spec.fill == "zeros":
            return bytes(n)
        if spec.fill == "ones":
            return (BF16_ONE if spec.dtype == "BF16" else F32_ONE) * count
        if spec.dtype != "BF16":
            raise ValueError(f"random fill is bf16 only: {spec.name}")
        start = self._rng.randrange(_POOL_BYTES // 2) * 2
        rotated = self._pool[start:] + self._pool[:start]
        return (rotated * (n // _POOL_BYTES + 1))[:n]


def safetensors_header(tensors: tuple[TensorSpec, ...]) -> bytes:
    """The length-prefixed JSON header; padded with spaces to 8 bytes as the reference does."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [pos, pos + t.nbytes],
        }
        pos += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return len(raw).to_bytes(8, "little") + raw


def write_shard(path: Path, shard: Shard, filler: _Filler) -> int:
    """Write one safetensors file; returns its size in bytes."""
    with open(path, "wb") as f:
        f.write(safetensors_header(shard.tensors))
        for t in shard.tensors:
            f.write(filler.data(t))
        return f.tell()


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# -- tokenizer ----------------------------------------------------------------------------------

_SPECIALS: dict[Arch, tuple[str, str, str]] = {
    "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
    "llama": ("<s>", "</s>", "<pad>"),
}
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
_TEXT = (
    "the model loads weights from shards while the server waits for memory and the cache grows "
    "each layer holds experts that route tokens through small matrices before the answer comes "
    "back from the engine a progress bar counts files and the daemon watches every line of the "
    "log to tell a slow start from a stall or a failure of one worker among many"
)
_WORDS = tuple(_TEXT.split())


def training_text(seed: int, sentences: int = 4000) -> Iterator[str]:
    """Sentences of English words and made-up syllable words, enough to learn ~2k merges."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ten", "ra", "shu", "vel", "or", "pi", "zan", "qu", "ex"]
    coined = ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(600)]
    for _ in range(sentences):
        n = rng.randint(6, 18)
        words = [rng.choice(_WORDS) if rng.random() < 0.6 else rng.choice(coined) for _ in range(n)]
        number = str(rng.randint(0, 99999))
        yield " ".join(words).capitalize() + f" {number}."


def write_tokenizer(out: Path, arch: Arch, seed: int, vocab_size: int) -> int:
    """Train a byte-level BPE and write tokenizer.json + tokenizer_config.json; returns its size."""
    from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    bos, eos, pad = _SPECIALS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[bos, eos, pad],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 0)]
    )
    tok.save(str(out / "tokenizer.json"))
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "pad_token": pad,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 4096,
            "chat_template": _CHAT_TEMPLATE,
        },
    )
    return int(tok.get_vocab_size())


# -- the whole checkpoint -----------------------------------------------------------------------


def fp8_kv_quant_config(quant_algo: str | None) -> dict[str, object]:
    """ModelOpt's legacy ``hf_quant_config.json`` declaring an FP8 KV cache.

    With a weight ``quant_algo`` every module is excluded from weight quantization, so only the
    KV-cache declaration takes effect on these bf16 weights.
    """
    quant: dict[str, object] = {"quant_algo": quant_algo, "kv_cache_quant_algo": "FP8"}
    quant["exclude_modules"] = ["*"] if quant_algo is not None else []
    return {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": quant}


def build_model(out: Path, opts: BuildOptions) -> BuiltModel:
    """Write the checkpoint into ``out`` (created; files of an earlier build are replaced)."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    quant_file = out / "hf_quant_config.json"
    if quant_file.exists():
        quant_file.unlink()

    tok_vocab = write_tokenizer(out, opts.arch, opts.seed, VOCAB_SIZE)
    vocab = -(-max(tok_vocab, VOCAB_SIZE) // 64) * 64  # padded as real checkpoints pad it
    cfg, tensors = plan(opts, vocab)
    shards = split_shards(tensors, opts.shards)
    filler = _Filler(opts.seed)
    files: list[Path] = []
    sizes: list[int] = []
    weight_map: dict[str, str] = {}
    for shard in shards:
        path = out / shard.file_name
        sizes.append(write_shard(path, shard, filler))
        files.append(path)
        weight_map.update((t.name, shard.file_name) for t in shard.tensors)
    total = sum(s.data_bytes for s in shards)
    _write_json(
        out / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    _write_json(out / "config.json", cfg)
    generation: dict[str, object] = {"bos_token_id": 0, "eos_token_id": 1}
    if opts.arch == "deepseek":
        generation |= {"do_sample": True, "temperature": 0.6, "top_p": 0.95}
    _write_json(out / "generation_config.json", generation)
    extra: tuple[str, ...] = ()
    if opts.fp8_kv_decl:
        _write_json(quant_file, fp8_kv_quant_config(opts.fp8_quant_algo))
        extra = (quant_file.name,)
    return BuiltModel(
        path=out,
        arch=opts.arch,
        config=cfg,
        shard_files=tuple(files),
        shard_sizes_bytes=tuple(sizes),
        total_size_bytes=total,
        num_layers=_int(cfg, "num_hidden_layers"),
        vocab_size=vocab,
        build_s=time.perf_counter() - t0,
        extra_files=extra,
    )


def _parse_args(argv: list[str] | None) -> tuple[Path, BuildOptions]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("outdir", type=Path)
    p.add_argument("--arch", choices=["deepseek", "llama"], default="deepseek")
    p.add_argument("--shards", type=int, default=12)
    p.add_argument("--shard-mb", type=float, default=100.0)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--kv-scales", action="store_true")
    p.add_argument("--fp8-kv-decl", action="store_true")
    p.add_argument(
        "--fp8-quant-algo",
        default="FP8",
        help="quant_algo written with --fp8-kv-decl; 'null' writes JSON null",
    )
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.shards < 1 or a.shard_mb <= 0 or (a.layers is not None and a.layers < 2):
        p.error("--shards must be >= 1, --shard-mb > 0, --layers >= 2")
    algo = None if a.fp8_quant_algo.lower() in ("null", "none") else a.fp8_quant_algo
    return a.outdir, BuildOptions(
        arch=a.arch,
        shards=a.shards,
        shard_mb=a.shard_mb,
        layers=a.layers,
        kv_scales=a.kv_scales,
        fp8_kv_decl=a.fp8_kv_decl,
        fp8_quant_algo=algo,
        seed=a.seed,
    )


def main(argv: list[str] | None = None) -> int:
    out, opts = _parse_args(argv)
    try:
        built = build_model(out, opts)
    except (OSError, ImportError) as exc:
        print(f"tinymodel: cannot build {out}: {exc}", file=sys.stderr)
        return 1
    mb = [round(s / MB, 1) for s in built.shard_sizes_bytes]
    print(
        f"{built.path}: {built.arch}, {built.num_layers} layers, {len(mb)} shards "
        f"{mb} MB, total {built.total_size_bytes / MB:.1f} MB, built in {built.build_s:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
