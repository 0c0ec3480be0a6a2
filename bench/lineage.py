"""Lineage benchmark (SPEC §14): random DAGs of 100 to 10,000 nodes; times
collect_lineage + lineage_to_narrative for the deepest node. Pure Python, no
database. See bench/README.md.

    python bench/lineage.py [--sizes 100,300,1000,3000,10000] [--repeat 7] [--seed 1]
"""
import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_results  # noqa: E402
from workflows.lineage import EdgeInfo, GraphInfo, NodeInfo, collect_lineage, lineage_to_narrative  # noqa: E402

TYPES = ["filter", "transform", "deduplicate", "llm_inference", "merge", "table_output"]


def random_dag(size: int, rng: random.Random) -> tuple[GraphInfo, str]:
    """Nodes in order; each node after the first has 1–2 parents among earlier nodes:
    mostly the previous node (a long spine, so the deepest node sees nearly all of the
    graph), else one of the 20 before it, and one time in four a second parent anywhere
    earlier (long-range joins). About one node
    in a hundred has changed settings since its run, so the stale warning is exercised."""
    nodes, edges, depth = [], [], []
    for i in range(size):
        parents = set()
        if i:
            parents.add(i - 1 if rng.random() < 0.95 else rng.randrange(max(0, i - 20), i))
            if i > 1 and rng.random() < 0.25:
                parents.add(rng.randrange(i))
        depth.append(1 + max((depth[p] for p in parents), default=-1))
        count = rng.randrange(10, 5000)
        changed = rng.random() < 0.01
        nodes.append(NodeInfo(
            id=f"n{i}", type=TYPES[i % len(TYPES)] if i else "inline_records", label=f"Step {i}",
            config={"field": f"f{i % 17}", "threshold": i % 100}, status="done",
            records_in=None if not i else count + 7, records_out=count, results_version=1 + i % 3,
            config_fingerprint=f"fp{i}", current_fingerprint=f"fp{i}-new" if changed else f"fp{i}"))
        edges.extend(EdgeInfo(f"n{p}", f"n{i}") for p in sorted(parents))
    deepest = max(range(size), key=lambda i: (depth[i], i))
    return GraphInfo(nodes=nodes, edges=edges), f"n{deepest}"


def measure(graph: GraphInfo, node_id: str, repeat: int) -> dict:
    collect, narrate, total = [], [], []
    for _ in range(repeat):
        gc.collect()  # each run starts from the same heap, as timeit does (GC stays on while timed)
        start = time.perf_counter()
        lineage = collect_lineage(graph, node_id)
        middle = time.perf_counter()
        text = lineage_to_narrative(lineage, max_chars=2000)
        end = time.perf_counter()
        collect.append((middle - start) * 1000)
        narrate.append((end - middle) * 1000)
        total.append((end - start) * 1000)
    return {
        "upstream_nodes": len(lineage.entries), "upstream_edges": len(lineage.edges),
        "narrative_chars": len(text), "stale": lineage.stale,
        "collect_ms": round(statistics.median(collect), 2), "narrative_ms": round(statistics.median(narrate), 2),
        "total_ms": round(statistics.median(total), 2), "max_total_ms": round(max(total), 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,300,1000,3000,10000")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON (default bench/results)")
    args = parser.parse_args()

    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        graph, node_id = random_dag(size, random.Random(args.seed + size))
        collect_lineage(graph, node_id)  # warm-up
        row = {"nodes": size, "edges": len(graph.edges), "node": node_id, **measure(graph, node_id, args.repeat)}
        row["us_per_upstream_node"] = round(row["total_ms"] * 1000 / row["upstream_nodes"], 2)
        rows.append(row)

    print(f"lineage: median of {args.repeat} runs, deepest node, max_chars=2000")
    print("| nodes | edges | upstream | collect ms | narrative ms | total ms | µs/upstream node | chars |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['nodes']:,} | {r['edges']:,} | {r['upstream_nodes']:,} | {r['collect_ms']} | "
              f"{r['narrative_ms']} | {r['total_ms']} | {r['us_per_upstream_node']} | {r['narrative_chars']} |")
    largest = rows[-1]
    target_met = largest["nodes"] < 10_000 or largest["total_ms"] <= 100
    print(f"target (≤ 100 ms at 10,000 nodes): {'met' if target_met else 'MISSED'}")
    figures = {"seed": args.seed, "repeat": args.repeat, "max_chars": 2000, "target_ms": 100,
               "target_met": target_met, "sizes": rows}
    kwargs = {"out_dir": args.out} if args.out else {}
    print("wrote", write_results("lineage", "python", figures, **kwargs))


if __name__ == "__main__":
    main()
