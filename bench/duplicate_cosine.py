"""How a real embedder scores paraphrases against related-but-different statements, to check
memories.ranking.DUPLICATE_MIN_COSINE (the vector rule of duplicate detection) for it.

Two hand-written sets of LoCoMo-like memory pairs (people, plans, pets, jobs, as in the
conversations): PARAPHRASES say the same thing in other words (a merge is right),
DIFFERENT say something else about the same person or topic (a merge loses a fact). Then,
on the LoCoMo turns themselves, how many pairs of one speaker's turns in one conversation
reach a cosine (no turn says the same thing twice on purpose, so a pair at the threshold
is a likely wrong merge; the word rules of ranking.is_duplicate run too and are shown).
Prints the figures and writes them as JSON to bench/results/.

    python bench/duplicate_cosine.py --embeddings http://127.0.0.1:8765/v1   # bench/embeddings_server.py
"""
import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS_DIR, ROOT, write_results  # noqa: E402
from bench.history_search import conversation_turns, load_conversations  # noqa: E402

DATA_DIR = ROOT.parent / "shared" / "bench-data" / "locomo-dev"
MODEL = "all-MiniLM-L6-v2"
THRESHOLDS = (0.8, 0.85, 0.9, 0.93, 0.95)

PARAPHRASES = [
    ("Maria prefers short answers", "Maria likes brief replies"),
    ("Caroline went to the LGBTQ support group yesterday", "Yesterday Caroline attended an LGBTQ support group"),
    ("Melanie is going camping with her kids next month", "Next month Melanie will take her children camping"),
    ("John's favourite food is sushi", "John likes sushi more than any other food"),
    ("The team deploys on Tuesdays", "Deployments happen every Tuesday"),
    ("Nate adopted a turtle", "Nate got a pet turtle"),
    ("Server passwords rotate every quarter", "Every three months the server passwords are changed"),
    ("Maria drinks oat milk cappuccino every morning", "Every morning Maria has a cappuccino with oat milk"),
    ("Jon lost his job as a banker", "Jon was laid off from his banking job"),
    ("Gina opened an online clothing store", "Gina started selling clothes through her own online shop"),
    ("Caroline wants to become a counselor", "Caroline hopes to work as a counsellor"),
    ("Melanie painted a sunset over the lake", "Melanie made a painting of the sun setting over a lake"),
    ("Audrey's dogs are called Pepper and Panda", "Audrey has two dogs named Pepper and Panda"),
    ("Joanna finished writing her first screenplay", "Joanna has completed her first movie script"),
    ("Tim is learning to play the violin", "Tim has started violin lessons"),
    ("Maria is allergic to peanuts", "Maria has a peanut allergy"),
    ("Evan's son broke his ankle playing soccer", "Evan's boy fractured his ankle during a soccer game"),
    ("Sam moved to Seattle in March", "In March Sam relocated to Seattle"),
]

DIFFERENT = [
    ("Maria likes tea", "Maria likes coffee"),
    ("Maria prefers short answers", "Maria prefers long answers"),
    ("Caroline went to the LGBTQ support group yesterday", "Caroline went to a pride parade yesterday"),
    ("Melanie is going camping with her kids next month", "Melanie went camping with her kids last month"),
    ("Nate adopted a turtle", "Nate adopted a dog"),
    ("John's favourite food is sushi", "John's favourite food is pizza"),
    ("Jon lost his job as a banker", "Jon started a dance studio"),
    ("Gina opened an online clothing store", "Gina closed her online clothing store"),
    ("Tim is learning to play the violin", "Tim is learning to play the piano"),
    ("The team deploys on Tuesdays", "The team deploys on Fridays"),
    ("Audrey's dogs are called Pepper and Panda", "Audrey's cats are called Pepper and Panda"),
    ("Joanna finished writing her first screenplay", "Joanna started writing her second screenplay"),
    ("Melanie painted a sunset over the lake", "Melanie photographed a sunset over the lake"),
    ("Maria is allergic to peanuts", "Maria is allergic to shellfish"),
    ("Evan's son broke his ankle playing soccer", "Evan's son broke his wrist playing soccer"),
    ("Sam moved to Seattle in March", "Sam moved to Portland in March"),
    ("Caroline wants to become a counselor", "Caroline used to be a counselor"),
    ("Maria is vegan", "Maria is vegetarian"),
]


def embed(endpoint: str, model: str, texts: list[str]) -> np.ndarray:
    import httpx

    vectors = []
    with httpx.Client(timeout=600) as client:
        for start in range(0, len(texts), 64):
            response = client.post(endpoint.rstrip("/") + "/embeddings",
                                   json={"model": model, "input": texts[start:start + 64]})
            response.raise_for_status()
            rows = sorted(response.json()["data"], key=lambda row: row["index"])
            vectors += [row["embedding"] for row in rows]
    matrix = np.asarray(vectors, dtype=np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def pair_cosines(endpoint: str, model: str, pairs: list[tuple[str, str]]) -> list[float]:
    vectors = embed(endpoint, model, [text for pair in pairs for text in pair])
    return [round(float(vectors[2 * i] @ vectors[2 * i + 1]), 4) for i in range(len(pairs))]


def describe(cosines: list[float]) -> dict:
    return {"count": len(cosines), "min": min(cosines), "median": round(statistics.median(cosines), 4),
            "max": max(cosines), **{f"at_least_{t}": sum(1 for c in cosines if c >= t) for t in THRESHOLDS}}


def locomo_pairs(endpoint: str, model: str, data_dir: Path) -> dict:
    """Pairs of one speaker's turns in one conversation at each threshold, and how many of
    them the word rules would still keep apart (set terms, numbers, meaning words)."""
    from memories import ranking

    counts = {t: 0 for t in THRESHOLDS}
    kept_apart = {t: 0 for t in THRESHOLDS}
    examples = []
    turns_total = 0
    for conversation_id, conversation in load_conversations(data_dir):
        turns = conversation_turns(conversation)
        turns_total += len(turns)
        texts = [f"{turn['sender']}: {turn['content']}" for turn in turns]
        vectors = embed(endpoint, model, texts)
        cosines = vectors @ vectors.T
        for i in range(len(turns)):
            for j in range(i + 1, len(turns)):
                if turns[i]["sender"] != turns[j]["sender"] or cosines[i, j] < min(THRESHOLDS):
                    continue
                if texts[i].casefold() == texts[j].casefold():
                    continue  # the same words: a duplicate by any rule
                similarity = float(cosines[i, j])
                apart = not ranking.is_duplicate(new_terms=ranking.term_set(texts[j]),
                                                 old_terms=ranking.term_set(texts[i]), new_subject="",
                                                 old_subject="", vector_similarity=1.0)
                for threshold in THRESHOLDS:
                    if similarity >= threshold:
                        counts[threshold] += 1
                        kept_apart[threshold] += apart
                if similarity >= ranking.DUPLICATE_MIN_COSINE:
                    examples.append({"conversation": conversation_id, "cosine": round(similarity, 4),
                                     "a": texts[i], "b": texts[j], "kept_apart_by_word_rules": apart})
    return {"turns": turns_total, "pairs_at_least": counts, "kept_apart_by_word_rules": kept_apart,
            "examples_at_current_threshold": sorted(examples, key=lambda e: -e["cosine"])[:20]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", required=True, metavar="URL", help="OpenAI-compatible endpoint")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    from memories import ranking

    paraphrases = pair_cosines(args.embeddings, args.model, PARAPHRASES)
    different = pair_cosines(args.embeddings, args.model, DIFFERENT)
    figures = {
        "model": args.model,
        "duplicate_min_cosine": ranking.DUPLICATE_MIN_COSINE,
        "paraphrases": describe(paraphrases),
        "different": describe(different),
        "pairs": {"paraphrases": list(zip(PARAPHRASES, paraphrases, strict=True)),
                  "different": list(zip(DIFFERENT, different, strict=True))},
        "locomo": locomo_pairs(args.embeddings, args.model, args.data.resolve()),
    }
    print(f"{args.model}: cosine of {len(PARAPHRASES)} paraphrase pairs and {len(DIFFERENT)} related-but-different "
          f"pairs (DUPLICATE_MIN_COSINE = {ranking.DUPLICATE_MIN_COSINE})")
    print(f"{'set':<12} {'min':>6} {'median':>6} {'max':>6} " + " ".join(f"{f'≥{t}':>6}" for t in THRESHOLDS))
    for name in ("paraphrases", "different"):
        row = figures[name]
        print(f"{name:<12} {row['min']:>6.3f} {row['median']:>6.3f} {row['max']:>6.3f} "
              + " ".join(f"{row[f'at_least_{t}']:>6}" for t in THRESHOLDS))
    locomo = figures["locomo"]
    print(f"\nLoCoMo: {locomo['turns']:,} turns; pairs of one speaker's different turns at or above each cosine "
          "(in brackets: kept apart by the word rules all the same)")
    print("  " + ", ".join(f"≥{t}: {locomo['pairs_at_least'][t]} ({locomo['kept_apart_by_word_rules'][t]})"
                           for t in THRESHOLDS))
    for example in locomo["examples_at_current_threshold"][:8]:
        print(f"  {example['cosine']:.3f} {example['a'][:70]!r} / {example['b'][:70]!r}")
    print(f"wrote {write_results('duplicate_cosine', 'model', figures, args.out)}")
    return 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
    os.environ.setdefault("SECRET_KEY", "kinsite-bench-only-secret-key-not-for-deployments")
    import django

    django.setup()
    sys.exit(main())
