"""Local embedder speed (EMBEDDINGS=local): on one core, the p50/p95 of embedding one query
(LoCoMo questions, one at a time, as search does) and the throughput of embedding texts one
at a time and in batches (LoCoMo turns, as a memory write and the re-embedding job do). No
database. See bench/README.md.

    python bench/embedder_speed.py [--queries 300] [--texts 1024] [--batch 32] [--cores 1]
"""
import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kinsite  # noqa: E402,F401  (sets OPENBLAS_NUM_THREADS=1 before numpy loads, as the product does)
from bench.common import MachineWatch, latency_summary, machine_state_line, write_results  # noqa: E402
from kinsite.llm import local_embedder  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "bench-data" / "locomo-dev"
SESSION_KEY = re.compile(r"session_\d+$")


def locomo_texts() -> tuple[list[str], list[str]]:
    """(questions, turns) of every conversation in the dev set, in file order."""
    questions, turns = [], []
    for path in sorted(DATA_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        questions += [str(item["question"]) for item in data["qa"]]
        conversation = data.get("conversation", data)
        for key, value in conversation.items():
            if SESSION_KEY.match(key) and isinstance(value, list):
                turns += [turn["text"] for turn in value if turn.get("text")]
    return questions, turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300, help="questions embedded one at a time")
    parser.add_argument("--texts", type=int, default=1024, help="turns embedded for throughput")
    parser.add_argument("--batch", type=int, default=256, help="texts per call in the batch run")
    parser.add_argument("--cores", type=int, default=1, help="CPU cores the process may use (sched_setaffinity)")
    args = parser.parse_args()

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))
    questions, turns = locomo_texts()
    questions, turns = questions[: args.queries], turns[: args.texts]
    started = time.perf_counter()
    embedder = local_embedder.local_embedder()
    embedder.embed(["warm up"])
    load_ms = (time.perf_counter() - started) * 1000

    with MachineWatch() as watch:
        query_ms = []
        for question in questions:
            started = time.perf_counter()
            embedder.embed([question])
            query_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        for text in turns:
            embedder.embed([text])
        single_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for start in range(0, len(turns), args.batch):
            embedder.embed(turns[start:start + args.batch])
        batch_seconds = time.perf_counter() - started

    figures = {
        "model": local_embedder.MODEL_NAME,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "load_ms": round(load_ms, 1),
        "query_embedding": latency_summary(query_ms),
        "mean_query_words": round(sum(len(q.split()) for q in questions) / len(questions), 1),
        "texts": len(turns),
        "mean_text_words": round(sum(len(t.split()) for t in turns) / len(turns), 1),
        "single_texts_per_second": round(len(turns) / single_seconds, 1),
        "batch_size": args.batch,
        "batch_texts_per_second": round(len(turns) / batch_seconds, 1),
        "machine_state": watch.figures,
    }
    q = figures["query_embedding"]
    print(f"{figures['model']} on {figures['cores']} core(s), model load {figures['load_ms']} ms")
    print(f"query embedding ({len(questions)} questions, {figures['mean_query_words']} words): "
          f"p50 {q['p50_ms']} ms, p95 {q['p95_ms']} ms, p99 {q['p99_ms']} ms")
    print(f"{len(turns)} turns ({figures['mean_text_words']} words): one at a time "
          f"{figures['single_texts_per_second']} texts/s; batches of {args.batch} "
          f"{figures['batch_texts_per_second']} texts/s")
    print(machine_state_line(watch.figures))
    print("written to", write_results("embedder_speed", "none", figures))


if __name__ == "__main__":
    main()
