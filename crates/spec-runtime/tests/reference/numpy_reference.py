#!/usr/bin/env python3
"""Independent numpy reference for the GGUF decoders used by spec-runtime.

Runs `llama` (SmolLM2) and `qwen2` (Qwen2.5-Coder) GGUF models with numpy only,
so the Rust/burn decoders can be checked against code that shares nothing with
them except the file format.

Model, as read from the GGUF file:
  x = token_embd[ids]
  per block:  h = x + Wo · Attn(RoPE(Wq·n + bq), RoPE(Wk·n + bk), Wv·n + bv),  n = RMSNorm(x)
              x = h + Wdown · (silu(Wgate·m) * (Wup·m)),                      m = RMSNorm(h)
  logits = output · RMSNorm(x)        (output = token_embd when output.weight is absent)
  RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w; causal grouped-query attention with
  scale 1/sqrt(head_dim); query head h reads kv head h // (n_head / n_head_kv).

RoPE pairing follows llama.cpp: the `llama` converter permutes Q/K so the file
wants the "normal" rotation of adjacent pairs (x[2i], x[2i+1]); `qwen2` wants
the NeoX rotation of (x[i], x[i + n_rot/2]). Angle for pair i at position p:
p * base^(-2i / n_rot).

GGUF dims are innermost-first: a weight with GGUF dims [in, out] is a numpy
array [out, in], so a linear layer is x @ W.T.

Precision: weights are dequantized once (gguf.quants.dequantize) and kept as
`--dtype` (float32 by default). Matmuls run in that dtype (BLAS); the RMSNorm
statistics, the softmax and the RoPE tables are computed in float64 and cast
back. `--dtype float64` makes everything float64 (about 2x memory), which is a
way to measure the float32 rounding of this reference itself.

Checked against llama.cpp (llama-cpp-python 0.3.36) run on the same files
re-written with F32 weights and an F32 KV cache: max relative logit difference
<= 4e-6 and identical greedy tokens for SmolLM2-135M, Qwen2.5-Coder-0.5B and
-1.5B. Stock llama.cpp on the quantized files differs by 2-6% (it quantizes
activations to 8 bits and keeps an f16 KV cache), so do not use it as the oracle.

BLAS runs single-threaded unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS are set.

Commands (see --help of each):
  generate  greedy continuations + top-2 logit gaps  -> ref.json
  compare   check another implementation's tokens and logits against this one
  dump      write an `ours.json` from this model itself (to test `compare`);
            --decode-logits takes the rows from the KV-cache decode steps
  encode    text -> token ids (approximate byte-level BPE; for debug prompts)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Decode steps are many small matrix-vector products; BLAS threads spinning on a
# busy machine make them ~10x slower. One thread unless the caller says otherwise.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# Which rotation each architecture's GGUF tensors expect (see module doc).
ROPE_STYLE = {"llama": "norm", "qwen2": "neox"}

# GGUF token_type value for control tokens (<|im_start|> and friends).
TOKEN_TYPE_CONTROL = 3


class RefModelError(Exception):
    """A problem with the inputs that the user must fix."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# GGUF metadata
# --------------------------------------------------------------------------

_MISSING = object()


def meta(reader: GGUFReader, key: str, default=_MISSING):
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise RefModelError(f"GGUF metadata key `{key}` is missing")
        return default
    return field.contents()


def open_gguf(path: str) -> GGUFReader:
    try:
        return GGUFReader(path)
    except OSError as err:
        raise RefModelError(f"cannot open {path}: {err}") from err
    except (ValueError, IndexError) as err:
        # gguf raises these for truncated or foreign files
        raise RefModelError(f"{path} is not a complete GGUF file (truncated download?): {err}") from err


@dataclass
class Config:
    arch: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    rope_base: float
    rope_dims: int
    rope_style: str
    eps: float
    vocab: int
    tied: bool
    context_length: int


def read_config(reader: GGUFReader, tensors: dict) -> Config:
    arch = meta(reader, "general.architecture")
    if arch not in ROPE_STYLE:
        raise RefModelError(f"architecture `{arch}` is not supported (only {sorted(ROPE_STYLE)})")
    scaling = meta(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise RefModelError(f"rope scaling `{scaling}` is not supported")
    hidden = int(meta(reader, f"{arch}.embedding_length"))
    n_heads = int(meta(reader, f"{arch}.attention.head_count"))
    n_kv_heads = int(meta(reader, f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(meta(reader, f"{arch}.attention.key_length", hidden // n_heads))
    value_dim = int(meta(reader, f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise RefModelError("key_length != value_length is not supported")
    if n_heads % n_kv_heads != 0:
        raise RefModelError(f"head_count {n_heads} not a multiple of head_count_kv {n_kv_heads}")
    rope_dims = int(meta(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dims % 2 != 0 or rope_dims > head_dim:
        raise RefModelError(f"rope.dimension_count {rope_dims} invalid for head_dim {head_dim}")
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise RefModelError("tensor `token_embd.weight` is missing")
    vocab = int(embd.shape[1])  # GGUF dims [hidden, vocab]
    return Config(
        arch=arch,
        n_layers=int(meta(reader, f"{arch}.block_count")),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        ffn=int(meta(reader, f"{arch}.feed_forward_length")),
        rope_base=float(meta(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_dims=rope_dims,
        rope_style=ROPE_STYLE[arch],
        eps=float(meta(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        vocab=vocab,
        tied="output.weight" not in tensors,
        context_length=int(meta(reader, f"{arch}.context_length", 0)),
    )


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


class KVCache:
    """Keys/values per layer, [n_kv_heads, capacity, head_dim] each."""

    def __init__(self, cfg: Config, dtype, capacity: int = 64):
        self.cfg = cfg
        self.dtype = dtype
        self.length = 0
        self._alloc(max(capacity, 1))

    def _alloc(self, capacity: int) -> None:
        shape = (self.cfg.n_layers, self.cfg.n_kv_heads, capacity, self.cfg.head_dim)
        k = np.zeros(shape, self.dtype)
        v = np.zeros(shape, self.dtype)
        if self.length:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v, self.capacity = k, v, capacity

    def reserve(self, extra: int) -> None:
        need = self.length + extra
        if need > self.capacity:
            self._alloc(max(need, 2 * self.capacity))

    def write(self, layer: int, k: np.ndarray, v: np.ndarray):
        """Store k, v ([kv_heads, T, d]) after the committed length; return all keys/values."""
        end = self.length + k.shape[1]
        self.k[layer, :, self.length : end] = k
        self.v[layer, :, self.length : end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def commit(self, n: int) -> None:
        self.length += n


class Model:
    def __init__(self, path: str, dtype=np.float32, rope_style: str = "auto"):
        t0 = time.perf_counter()
        self.path = path
        self.dtype = np.dtype(dtype)
        self.reader = open_gguf(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.cfg = read_config(self.reader, self.tensors)
        if rope_style != "auto":
            # Debug only: run with the other pairing to see that it breaks the output.
            self.cfg.rope_style = rope_style
        self.used: set[str] = set()
        c = self.cfg
        qd, kvd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            self.layers.append(
                {
                    "attn_norm": self._load(p + "attn_norm.weight", (c.hidden,)),
                    "wq": self._load(p + "attn_q.weight", (qd, c.hidden)),
                    "wk": self._load(p + "attn_k.weight", (kvd, c.hidden)),
                    "wv": self._load(p + "attn_v.weight", (kvd, c.hidden)),
                    "wo": self._load(p + "attn_output.weight", (c.hidden, qd)),
                    # Qwen2 has q/k/v biases; llama files normally have none.
                    "bq": self._load(p + "attn_q.bias", (qd,), optional=True),
                    "bk": self._load(p + "attn_k.bias", (kvd,), optional=True),
                    "bv": self._load(p + "attn_v.bias", (kvd,), optional=True),
                    "bo": self._load(p + "attn_output.bias", (c.hidden,), optional=True),
                    "ffn_norm": self._load(p + "ffn_norm.weight", (c.hidden,)),
                    "wg": self._load(p + "ffn_gate.weight", (c.ffn, c.hidden)),
                    "wu": self._load(p + "ffn_up.weight", (c.ffn, c.hidden)),
                    "wd": self._load(p + "ffn_down.weight", (c.hidden, c.ffn)),
                }
            )
        self.output_norm = self._load("output_norm.weight", (c.hidden,))
        if c.tied:
            self.output = self._load("token_embd.weight", (c.vocab, c.hidden))
            self.embd_full = self.output
        else:
            self.output = self._load("output.weight", (c.vocab, c.hidden))
            # Untied: quantized rows are independent, so dequantize only the rows looked up.
            self.embd_full = None
            self._check_shape("token_embd.weight", (c.vocab, c.hidden))
            self.used.add("token_embd.weight")
        unused = sorted(set(self.tensors) - self.used)
        if unused:
            raise RefModelError(f"tensors this reference does not understand: {unused[:8]}")
        # RoPE inverse frequencies, float64.
        i = np.arange(c.rope_dims // 2, dtype=np.float64)
        self.inv_freq = c.rope_base ** (-2.0 * i / c.rope_dims)
        self.load_seconds = time.perf_counter() - t0

    def _check_shape(self, name: str, shape: tuple) -> None:
        t = self.tensors[name]
        found = tuple(int(d) for d in reversed(t.shape))
        if found != shape:
            raise RefModelError(f"tensor `{name}`: expected numpy shape {shape}, found {found}")

    def _load(self, name: str, shape: tuple, optional: bool = False):
        if name not in self.tensors:
            if optional:
                return None
            raise RefModelError(f"tensor `{name}` is missing")
        self._check_shape(name, shape)
        t = self.tensors[name]
        w = dequantize(np.asarray(t.data), t.tensor_type)
        w = np.ascontiguousarray(w.reshape(shape), dtype=self.dtype)
        self.used.add(name)
        return w

    def embed(self, ids: np.ndarray) -> np.ndarray:
        if self.embd_full is not None:
            return self.embd_full[ids]
        t = self.tensors["token_embd.weight"]
        rows = dequantize(np.asarray(t.data)[ids], t.tensor_type)
        return rows.reshape(len(ids), self.cfg.hidden).astype(self.dtype)

    def rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.cfg.eps)
        return (x * scale.astype(self.dtype)) * w

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x: [heads, T, head_dim]; cos/sin: [T, rope_dims/2]."""
        r = self.cfg.rope_dims
        out = x.copy()
        if self.cfg.rope_style == "norm":
            a, b = x[..., 0:r:2], x[..., 1:r:2]
            out[..., 0:r:2] = a * cos - b * sin
            out[..., 1:r:2] = a * sin + b * cos
        else:
            h = r // 2
            a, b = x[..., :h], x[..., h:r]
            out[..., :h] = a * cos - b * sin
            out[..., h:r] = a * sin + b * cos
        return out

    def forward(self, ids, cache: KVCache, logits_from: int | None = None) -> np.ndarray:
        """Run `ids` after the cached positions.

        Returns logits [T - logits_from, vocab] for rows logits_from.. of this
        chunk (default: the last row only).
        """
        c, dt = self.cfg, self.dtype
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise RefModelError("forward needs a non-empty list of token ids")
        if ids.min() < 0 or ids.max() >= c.vocab:
            raise RefModelError(f"token id out of range [0, {c.vocab})")
        T = len(ids)
        past = cache.length
        S = past + T
        cache.reserve(T)
        x = self.embed(ids)
        ang = np.arange(past, S, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
        # mask[t, s] true where key s is visible to query at position past + t
        mask = np.arange(S)[None, :] <= (past + np.arange(T))[:, None]
        H, Hkv, d = c.n_heads, c.n_kv_heads, c.head_dim
        G = H // Hkv
        scale = 1.0 / math.sqrt(d)
        for li, L in enumerate(self.layers):
            n = self.rms_norm(x, L["attn_norm"])
            q, k, v = n @ L["wq"].T, n @ L["wk"].T, n @ L["wv"].T
            if L["bq"] is not None:
                q = q + L["bq"]
            if L["bk"] is not None:
                k = k + L["bk"]
            if L["bv"] is not None:
                v = v + L["bv"]
            q = q.reshape(T, H, d).transpose(1, 0, 2)
            k = k.reshape(T, Hkv, d).transpose(1, 0, 2)
            v = v.reshape(T, Hkv, d).transpose(1, 0, 2)
            q = self.rope(q, cos, sin)
            k = self.rope(k, cos, sin)
            K, V = cache.write(li, k, v)  # [Hkv, S, d]
            qg = q.reshape(Hkv, G * T, d)  # heads kv*G .. kv*G+G-1 share kv head kv
            scores = (qg @ K.transpose(0, 2, 1)).astype(np.float64) * scale
            scores = scores.reshape(Hkv, G, T, S)
            scores = np.where(mask, scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            attn = p.astype(dt).reshape(Hkv, G * T, S) @ V  # [Hkv, G*T, d]
            attn = attn.reshape(H, T, d).transpose(1, 0, 2).reshape(T, H * d)
            o = attn @ L["wo"].T
            if L["bo"] is not None:
                o = o + L["bo"]
            x = x + o
            m = self.rms_norm(x, L["ffn_norm"])
            g = m @ L["wg"].T
            u = m @ L["wu"].T
            # silu(g) = g * sigmoid(g), sigmoid via tanh to avoid exp overflow
            act = g * (0.5 * (1.0 + np.tanh(0.5 * g))) * u
            x = x + act @ L["wd"].T
        cache.commit(T)
        start = T - 1 if logits_from is None else logits_from
        h = self.rms_norm(x[start:], self.output_norm)
        logits = h @ self.output.T
        if not np.all(np.isfinite(logits)):
            raise RefModelError("non-finite logits in the reference (bug or broken file)")
        return logits


# --------------------------------------------------------------------------
# Decoding helpers
# --------------------------------------------------------------------------


def top2(row: np.ndarray):
    """(argmax with ties to the lowest id, best - second best)."""
    best = int(np.argmax(row))  # numpy returns the first maximal index
    part = np.partition(row.astype(np.float64), -2)[-2:]
    return best, float(part[1] - part[0])


def greedy(model: Model, prompt: list[int], n: int, rows: list | None = None):
    """Greedy continuation of n tokens using the KV cache; returns (tokens, gaps).

    When `rows` is a list, the logits row behind each choice is appended to it.
    """
    if not prompt:
        raise RefModelError("empty prompt")
    cache = KVCache(model.cfg, model.dtype, len(prompt) + n)
    row = model.forward(prompt, cache)[-1]
    tokens, gaps = [], []
    for i in range(n):
        t, gap = top2(row)
        tokens.append(t)
        gaps.append(gap)
        if rows is not None:
            rows.append(row)
        if i + 1 < n:
            row = model.forward([t], cache)[-1]
    return tokens, gaps


def teacher_forced(model: Model, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Logits [len(tokens), vocab]; row i predicts tokens[i] after prompt + tokens[:i]."""
    if not prompt:
        raise RefModelError("empty prompt")
    if not tokens:
        return np.zeros((0, model.cfg.vocab), model.dtype)
    seq = list(prompt) + list(tokens[:-1])
    cache = KVCache(model.cfg, model.dtype, len(seq))
    return model.forward(seq, cache, logits_from=len(prompt) - 1)


# --------------------------------------------------------------------------
# Vocabulary (debug prompts and text only)
# --------------------------------------------------------------------------

# Pre-tokenizer split in the style of the GPT-2 / Qwen2 regexes, with
# \p{L} ~ [^\W\d_] and \p{N} ~ \d because `re` has no Unicode classes. Close to,
# not exactly, what each model's own tokenizer does; fine for debug prompts.
_LETTER = r"[^\W\d_]"
_PRETOKEN = re.compile(
    r"'(?i:s|t|re|ve|m|ll|d)"
    rf"|(?:[^\r\n\w]|_)?{_LETTER}+"
    r"|\d"
    rf"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level mapping: printable bytes map to themselves, the rest
    to code points from 256 up, in byte order ('Ġ' = space, 'Ċ' = newline)."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


class Vocab:
    """Byte-level BPE vocabulary from `tokenizer.ggml.*` (gpt2-style models)."""

    def __init__(self, reader: GGUFReader):
        self.tokens: list[str] = meta(reader, "tokenizer.ggml.tokens")
        types = meta(reader, "tokenizer.ggml.token_type", [1] * len(self.tokens))
        pairs = enumerate(zip(self.tokens, types, strict=True))
        self.special = {t: i for i, (t, ty) in pairs if ty == TOKEN_TYPE_CONTROL}
        self.special_ids = set(self.special.values())
        self.index = {}
        for i, t in enumerate(self.tokens):
            self.index.setdefault(t, i)
        merges = meta(reader, "tokenizer.ggml.merges", [])
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.b2u = byte_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}

    def decode(self, ids) -> str:
        out = bytearray()
        for i in ids:
            t = self.tokens[i]
            if i in self.special_ids:
                out += t.encode()
            else:
                for ch in t:
                    b = self.u2b.get(ch)
                    out += bytes([b]) if b is not None else ch.encode()
        return out.decode("utf-8", errors="replace")

    def encode(self, text: str) -> list[int]:
        """Control tokens by exact match, the rest by pre-token split + BPE merges."""
        ids: list[int] = []
        specials = sorted(self.special, key=len, reverse=True)
        i, plain = 0, ""
        while i < len(text):
            hit = next((s for s in specials if s and text.startswith(s, i)), None)
            if hit:
                ids += self._encode_plain(plain)
                plain = ""
                ids.append(self.special[hit])
                i += len(hit)
            else:
                plain += text[i]
                i += 1
        return ids + self._encode_plain(plain)

    def _encode_plain(self, text: str) -> list[int]:
        ids = []
        for piece in _PRETOKEN.findall(text):
            word = [self.b2u[b] for b in piece.encode("utf-8")]
            while len(word) > 1:
                pairs = enumerate(zip(word[:-1], word[1:], strict=True))
                best, k = min((self.ranks.get(pair, math.inf), k) for k, pair in pairs)
                if best == math.inf:
                    break
                word[k : k + 2] = [word[k] + word[k + 1]]
            for w in word:
                if w not in self.index:
                    raise RefModelError(f"BPE piece {w!r} is not in the vocabulary")
                ids.append(self.index[w])
        return ids


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def load_prompts(path: str):
    with open(path) as f:
        prompts = json.load(f)
    if not isinstance(prompts, list):
        raise RefModelError(f"{path}: expected a JSON list of {{name, tokens}}")
    for p in prompts:
        if not isinstance(p, dict) or "name" not in p or "tokens" not in p:
            raise RefModelError(f"{path}: every entry needs `name` and `tokens`")
        if not p["tokens"]:
            raise RefModelError(f"{path}: prompt `{p['name']}` has no tokens")
    return prompts


def print_config(model: Model) -> None:
    log(f"model {model.path}: " + ", ".join(f"{k}={v}" for k, v in asdict(model.cfg).items()))
    log(f"loaded in {model.load_seconds:.1f}s (dtype {model.dtype})")


def cmd_generate(args) -> int:
    model = Model(args.model, args.dtype, args.rope_style)
    print_config(model)
    vocab = Vocab(model.reader) if args.show_text else None
    prompts = load_prompts(args.prompts)
    out = []
    for p in prompts:
        t0 = time.perf_counter()
        toks, gaps = greedy(model, p["tokens"], args.max_new_tokens)
        dt = time.perf_counter() - t0
        out.append({"name": p["name"], "prompt_tokens": p["tokens"], "tokens": toks, "top2_gaps": gaps})
        log(
            f"[{p['name']}] {len(p['tokens'])} prompt + {len(toks)} new tokens in {dt:.1f}s, "
            f"min top-2 gap {min(gaps) if gaps else float('nan'):.4f}"
        )
        if vocab:
            log(f"  prompt: {vocab.decode(p['tokens'])!r}")
            log(f"  output: {vocab.decode(toks)!r}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


def cmd_dump(args) -> int:
    """Write ours.json + .f32 logits from this model, in the format `compare` reads."""
    model = Model(args.model, args.dtype, args.rope_style)
    print_config(model)
    out_path = Path(args.out)
    entries = []
    for idx, p in enumerate(load_prompts(args.prompts)):
        rows: list = []
        toks, _ = greedy(model, p["tokens"], args.max_new_tokens, rows)
        if args.decode_logits:
            # rows from the KV-cache decode: differ from compare's batched pass by f32 rounding
            logits = np.stack(rows).astype("<f4")
        else:
            logits = teacher_forced(model, p["tokens"], toks).astype("<f4")
        fname = f"{out_path.stem}_{idx:03d}.f32"
        logits.tofile(out_path.parent / fname)
        entries.append(
            {"name": p["name"], "prompt_tokens": p["tokens"], "tokens": toks, "logits_file": fname}
        )
        log(f"[{p['name']}] dumped {logits.shape} -> {fname}")
    with open(out_path, "w") as f:
        json.dump(entries, f, indent=1)
    return 0


def cmd_compare(args) -> int:
    model = Model(args.model, args.dtype, args.rope_style)
    print_config(model)
    vocab_n = model.cfg.vocab
    ours_path = Path(args.ours)
    with open(ours_path) as f:
        ours = json.load(f)
    reports = []
    for e in ours:
        for key in ("name", "prompt_tokens", "tokens", "logits_file"):
            if key not in e:
                raise RefModelError(f"{ours_path}: entry lacks `{key}`")
        name, prompt, toks = e["name"], list(e["prompt_tokens"]), list(e["tokens"])
        lpath = Path(e["logits_file"])
        if not lpath.is_absolute():
            lpath = ours_path.parent / lpath
        raw = np.fromfile(lpath, dtype="<f4")
        if raw.size != len(toks) * vocab_n:
            raise RefModelError(
                f"{lpath}: {raw.size} floats, expected len(tokens)*vocab = {len(toks)}*{vocab_n}"
            )
        ours_logits = raw.reshape(len(toks), vocab_n).astype(np.float64)
        t0 = time.perf_counter()
        ref = teacher_forced(model, prompt, toks).astype(np.float64)
        ref_greedy, ref_gaps = greedy(model, prompt, len(toks))
        dt = time.perf_counter() - t0

        with np.errstate(invalid="ignore"):
            diff = np.abs(ours_logits - ref).max(axis=1)
        diff = np.where(np.isfinite(ours_logits).all(axis=1), diff, np.inf)
        rel = diff / np.abs(ref).max(axis=1)
        tf = [top2(r) for r in ref]
        argmax_bad = [i for i, t in enumerate(toks) if t != tf[i][0]]
        greedy_bad = [i for i, (a, b) in enumerate(zip(toks, ref_greedy, strict=True)) if a != b]
        self_bad = [
            i
            for i, t in enumerate(toks)
            if np.isfinite(ours_logits[i]).all() and t != int(np.argmax(ours_logits[i]))
        ]
        first = None
        cands = ([argmax_bad[0]] if argmax_bad else []) + ([greedy_bad[0]] if greedy_bad else [])
        if cands:
            i = min(cands)
            first = {
                "index": i,
                "ours_token": toks[i],
                "ref_greedy_token": ref_greedy[i] if i < len(ref_greedy) else None,
                "ref_greedy_top2_gap": ref_gaps[i] if i < len(ref_gaps) else None,
                "ref_teacher_forced_argmax": tf[i][0],
                "ref_teacher_forced_top2_gap": tf[i][1],
                "argmax_mismatch": i in argmax_bad,
                "greedy_mismatch": i in greedy_bad,
            }
        r = {
            "name": name,
            "max_rel": float(rel.max()) if len(rel) else 0.0,
            "mean_rel": float(rel.mean()) if len(rel) else 0.0,
            "greedy_equal": not greedy_bad,
            "argmax_equal": not argmax_bad,
            "ours_tokens_are_own_argmax": not self_bad,
            "first_mismatch": first,
            "seconds": dt,
        }
        reports.append(r)
        status = "ok" if r["greedy_equal"] and r["max_rel"] <= args.rel_tol else "FAIL"
        log(
            f"[{name}] {status}: max_rel {r['max_rel']:.3e} mean_rel {r['mean_rel']:.3e} "
            f"greedy_equal {r['greedy_equal']} argmax_equal {r['argmax_equal']} ({dt:.1f}s)"
        )
        if first:
            log(
                f"  first mismatch at {first['index']}: ours {first['ours_token']} ref greedy "
                f"{first['ref_greedy_token']} (gap {first['ref_greedy_top2_gap']}), teacher-forced argmax "
                f"{first['ref_teacher_forced_argmax']} (gap {first['ref_teacher_forced_top2_gap']:.4g})"
            )
        if self_bad:
            log(f"  warning: ours tokens differ from argmax of ours logits at {self_bad[:8]}")
    report = {
        "model": str(args.model),
        "rel_tol": args.rel_tol,
        "prompts": reports,
        "max_rel": max((r["max_rel"] for r in reports), default=0.0),
        "all_greedy_equal": all(r["greedy_equal"] for r in reports),
    }
    ok = report["max_rel"] <= args.rel_tol and report["all_greedy_equal"]
    report["pass"] = ok
    print(
        f"{'PASS' if ok else 'FAIL'}: {len(reports)} prompts, max_rel {report['max_rel']:.3e} "
        f"(tol {args.rel_tol:g}), all_greedy_equal {report['all_greedy_equal']}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1


def cmd_encode(args) -> int:
    vocab = Vocab(open_gguf(args.model))
    with open(args.texts) as f:
        texts = json.load(f)
    out = []
    for t in texts:
        ids = vocab.encode(t["text"])
        out.append({"name": t["name"], "tokens": ids})
        log(f"[{t['name']}] {len(ids)} tokens; round trip ok: {vocab.decode(ids) == t['text']}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{generate,compare,encode}")

    def common(p):
        p.add_argument("--model", required=True, help="GGUF file (llama or qwen2)")
        p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
        p.add_argument(
            "--rope-style", default="auto", choices=["auto", "norm", "neox"], help=argparse.SUPPRESS
        )

    g = sub.add_parser("generate", help="greedy continuations -> ref.json")
    common(g)
    g.add_argument("--prompts", required=True, help='JSON [{"name", "tokens"}]')
    g.add_argument("--max-new-tokens", type=int, required=True)
    g.add_argument("--out", required=True)
    g.add_argument(
        "--show-text", action="store_true", help="print prompts/outputs decoded with the GGUF vocabulary"
    )
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("compare", help="check ours.json (tokens + f32 logits) against this reference")
    common(c)
    c.add_argument("--ours", required=True)
    c.add_argument("--rel-tol", type=float, default=1e-3)
    c.add_argument("--out", help="write the JSON report here")
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser("dump")  # hidden: no help= keeps it out of the listing
    common(d)
    d.add_argument("--prompts", required=True)
    d.add_argument("--max-new-tokens", type=int, required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--decode-logits", action="store_true", help="logits from the KV-cache decode steps")
    d.set_defaults(func=cmd_dump)

    e = sub.add_parser("encode", help="text -> token ids (approximate BPE, debug prompts)")
    e.add_argument("--model", required=True)
    e.add_argument("--texts", required=True, help='JSON [{"name", "text"}]')
    e.add_argument("--out", required=True)
    e.set_defaults(func=cmd_encode)

    args = ap.parse_args(argv)
    if getattr(args, "max_new_tokens", 1) < 1:
        ap.error("--max-new-tokens must be >= 1")
    try:
        return args.func(args)
    except (RefModelError, OSError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
