"""How a real embedder scores paraphrases against related-but-different statements, to check
memories.ranking.DUPLICATE_MIN_COSINE (the vector rule of duplicate detection) for it.

Two hand-written sets of LoCoMo-like memory pairs (people, plans, pets, jobs, as in the
conversations): PARAPHRASES say the same thing in other words (a merge is right),
DIFFERENT say something else about the same person or topic (a merge loses a fact). Then,
on the LoCoMo turns themselves, how many pairs of one speaker's turns in one conversation
reach a cosine (no turn says the same thing twice on purpose, so a pair at the threshold
is a likely wrong merge; the word rules of ranking.is_duplicate run too and are shown).
Prints the figures and writes them as JSON to bench/results/.

NEAR_MISSES are the same sentence with one value changed (a name, number, option letter, day,
month, place, version); a merge there loses the fact most of all, and an embedder scores them
close (MiniLM: "Option A is chosen" / "Option B is chosen" 0.86). Each pair set is then judged
by duplicate rules: the cosine alone, memories.ranking.is_duplicate as shipped (at several
DUPLICATE_MIN_COSINE), and is_duplicate with the value rule below (value_tokens) in front.

    python bench/duplicate_cosine.py --embeddings local                       # the in-process model
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
THRESHOLDS = (0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.95)

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
    # Paraphrases that keep a value (a letter, number, name, day, place, version) as it is.
    ("We picked option A", "Option A is chosen"),
    ("Plan B is the fallback", "If it fails we fall back to plan B"),
    ("The meeting moved to Thursday at 3pm", "The meeting is now on Thursday at 3pm"),
    ("Caroline's birthday is on 12 June", "Caroline was born on June 12"),
    ("Nate lives in Denver", "Nate's home is in Denver"),
    ("The deploy uses port 8080", "Port 8080 is what the deploy listens on"),
    ("Melanie has three kids", "Melanie is a mother of three"),
    ("Tim flew to Tokyo last week", "Last week Tim took a flight to Tokyo"),
    ("Maria's flight leaves at 7am on Monday", "On Monday Maria flies out at 7am"),
    ("Joanna's dog is called Max", "Joanna has a dog named Max"),
    ("The budget for Q3 is 40,000 euros", "Q3's budget is EUR 40,000"),
    ("Evan runs every morning before work", "Every morning Evan goes for a run before work"),
    ("Audrey volunteers at the animal shelter on Saturdays", "On Saturdays Audrey helps out at the animal shelter"),
    ("Caroline prefers to be called Carrie", "Caroline likes people to call her Carrie"),
    ("The release is version 2.4", "We are shipping version 2.4"),
    ("John is afraid of flying", "John has a fear of flying"),
    ("Sam switched from Python to Go", "Sam moved from Python to Go"),
    ("The user wants answers in French", "Reply to the user in French"),
    ("Jon's appointment is with Dr. Smith on Friday", "On Friday Jon sees Dr. Smith"),
    ("Gina moved to Chicago in 2019", "In 2019 Gina relocated to Chicago"),
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

# The same sentence with one value changed: a merge keeps one of two different facts.
NEAR_MISSES = [
    ("Option A is chosen", "Option B is chosen"),
    ("We picked option A", "We picked option B"),
    ("Plan A is the fallback", "Plan B is the fallback"),
    ("The API key is stored in vault A", "The API key is stored in vault B"),
    ("Option 1 was rejected", "Option 2 was rejected"),
    ("The meeting is on Tuesday", "The meeting is on Thursday"),
    ("Audrey volunteers at the shelter on Saturdays", "Audrey volunteers at the shelter on Sundays"),
    ("Maria's flight leaves at 7am on Monday", "Maria's flight leaves at 7am on Tuesday"),
    ("The meeting starts at 3pm", "The meeting starts at 5pm"),
    ("The standup is at 9:30", "The standup is at 10:30"),
    ("Caroline's birthday is on 12 June", "Caroline's birthday is on 21 June"),
    ("Caroline's birthday is in June", "Caroline's birthday is in July"),
    ("The project deadline is March 3", "The project deadline is May 3"),
    ("Gina moved to Chicago in 2019", "Gina moved to Chicago in 2021"),
    ("Melanie has two kids", "Melanie has three kids"),
    ("Audrey has 2 dogs", "Audrey has 3 dogs"),
    ("Evan's son is 8 years old", "Evan's son is 9 years old"),
    ("Melanie ran a 5k race", "Melanie ran a 10k race"),
    ("The deploy uses port 8080", "The deploy uses port 8081"),
    ("The release is version 2.4", "The release is version 2.5"),
    ("The budget for Q3 is 40,000 euros", "The budget for Q4 is 40,000 euros"),
    ("Tim is in room 204", "Tim is in room 402"),
    ("Nate lives in Denver", "Nate lives in Boston"),
    ("Tim flew to Tokyo last week", "Tim flew to Osaka last week"),
    ("Joanna's dog is called Max", "Joanna's dog is called Rex"),
    ("Caroline's sister is called Emma", "Caroline's sister is called Anna"),
    ("Nate's turtle is named Shelly", "Nate's turtle is named Speedy"),
    ("Jon's appointment is with Dr. Smith", "Jon's appointment is with Dr. Jones"),
    ("John's favourite team is the Lakers", "John's favourite team is the Celtics"),
    ("Sam switched from Python to Go", "Sam switched from Python to Rust"),
    ("The user wants answers in French", "The user wants answers in German"),
    ("Reply in English", "Reply in Spanish"),
    # One value changed that is not written as a value (lower case, no digit): the value rule
    # cannot see these; they are here so that its confusion counts say so.
    ("Use the staging server for tests", "Use the production server for tests"),
    ("Caroline takes the bus on Monday", "Caroline takes the train on Monday"),
    ("The first draft is due Friday", "The second draft is due Friday"),
]

# --- the value rule: memories.ranking.values_differ, measured with and without time words ----


def values_differ(a: str, b: str, time_words: bool = False) -> bool:
    from memories import ranking

    return ranking.values_differ(a, b, time_words=time_words)


def value_tokens(text: str, time_words: bool = False) -> frozenset[str]:
    from memories import ranking

    return ranking.value_tokens(text, time_words=time_words)


def shipped_duplicate(a: str, b: str, cosine: float, threshold: float) -> bool:
    """memories.ranking.is_duplicate as shipped (no subjects), its cosine threshold `threshold`."""
    from memories import ranking

    saved, ranking.DUPLICATE_MIN_COSINE = ranking.DUPLICATE_MIN_COSINE, threshold
    try:
        return ranking.is_duplicate(new_terms=ranking.term_set(b), old_terms=ranking.term_set(a),
                                    new_subject="", old_subject="", vector_similarity=cosine)
    finally:
        ranking.DUPLICATE_MIN_COSINE = saved


# name -> rule(a, b, cosine) -> merge?
def rules() -> dict:
    found = {}
    for threshold in (0.85, 0.9, 0.93, 0.95):
        found[f"cosine ≥ {threshold:g} alone"] = lambda a, b, c, t=threshold: c >= t
    for threshold in (0.9, 0.93, 0.95):
        found[f"is_duplicate, cosine {threshold:g} (shipped rules)"] = (
            lambda a, b, c, t=threshold: shipped_duplicate(a, b, c, t))
    for threshold in (0.9, 0.93, 0.95):
        found[f"value rule + is_duplicate, cosine {threshold:g}"] = (
            lambda a, b, c, t=threshold: not values_differ(a, b) and shipped_duplicate(a, b, c, t))
    for threshold in (0.93, 0.95):
        found[f"value+time rule + is_duplicate, cosine {threshold:g}"] = (
            lambda a, b, c, t=threshold: not values_differ(a, b, True) and shipped_duplicate(a, b, c, t))
    for time_words in (False, True):
        # Two texts naming the same values (at least one) merge from a lower cosine.
        name = "value+time" if time_words else "value"
        found[f"{name} rule + is_duplicate 0.93; same values: cosine 0.75"] = (
            lambda a, b, c, w=time_words: not values_differ(a, b, w) and (
                shipped_duplicate(a, b, c, 0.93) or (bool(value_tokens(a, w)) and shipped_duplicate(a, b, c, 0.75))))
    return found


def embed(endpoint: str, model: str, texts: list[str]) -> np.ndarray:
    if endpoint == "local":
        from kinsite.llm import local_embedder

        return local_embedder.local_embedder().embed(texts)  # unit vectors already
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
    kept_apart_values = {t: 0 for t in THRESHOLDS}
    rule_set = rules()
    merged = dict.fromkeys(rule_set, 0)
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
                for rule_name, rule in rule_set.items():
                    # The speaker's name starts both texts ("Caroline: ..."): the rules read the turns.
                    merged[rule_name] += rule(turns[i]["content"], turns[j]["content"], similarity)
                # The speaker's name starts both texts ("Caroline: ..."): the value rule reads the turns.
                values_apart = apart or values_differ(turns[i]["content"], turns[j]["content"])
                for threshold in THRESHOLDS:
                    if similarity >= threshold:
                        counts[threshold] += 1
                        kept_apart[threshold] += apart
                        kept_apart_values[threshold] += values_apart
                if similarity >= ranking.DUPLICATE_MIN_COSINE:
                    examples.append({"conversation": conversation_id, "cosine": round(similarity, 4),
                                     "a": texts[i], "b": texts[j], "kept_apart_by_word_rules": apart,
                                     "kept_apart_with_value_rule": values_apart})
    return {"turns": turns_total, "pairs_at_least": counts, "kept_apart_by_word_rules": kept_apart,
            "kept_apart_with_value_rule": kept_apart_values,
            "merged_by_rule_at_cosine_0.7_or_more": merged,
            "examples_at_current_threshold": sorted(examples, key=lambda e: -e["cosine"])[:20]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", required=True, metavar="local|URL",
                        help="'local': the in-process model (kinsite.llm.local_embedder); else an OpenAI-compatible "
                             "endpoint")
    parser.add_argument("--model", default=MODEL, help="the endpoint's model (not for local)")
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    from memories import ranking

    if args.embeddings == "local":
        from kinsite.llm import local_embedder

        args.model = local_embedder.MODEL_NAME
    sets = {"paraphrases": PARAPHRASES, "different": DIFFERENT, "near_misses": NEAR_MISSES}
    cosines = {name: pair_cosines(args.embeddings, args.model, pairs) for name, pairs in sets.items()}
    confusion = {}
    for rule_name, rule in rules().items():
        merged = {name: [i for i, ((a, b), c) in enumerate(zip(pairs, cosines[name], strict=True)) if rule(a, b, c)]
                  for name, pairs in sets.items()}
        confusion[rule_name] = {
            "paraphrases_merged": len(merged["paraphrases"]),
            "paraphrases_missed": len(sets["paraphrases"]) - len(merged["paraphrases"]),
            "different_merged": len(merged["different"]),
            "near_misses_merged": len(merged["near_misses"]),
            "wrong_merges": [sets[name][i] for name in ("different", "near_misses") for i in merged[name]],
        }
    figures = {
        "model": args.model,
        "duplicate_min_cosine": ranking.DUPLICATE_MIN_COSINE,
        **{name: describe(values) for name, values in cosines.items()},
        "pairs": {name: [{"a": a, "b": b, "cosine": c, "values_differ": values_differ(a, b),
                          "shipped_merge_at_0.93": shipped_duplicate(a, b, c, 0.93)}
                         for (a, b), c in zip(pairs, cosines[name], strict=True)] for name, pairs in sets.items()},
        "rules": confusion,
        "locomo": locomo_pairs(args.embeddings, args.model, args.data.resolve()),
    }
    print(f"{args.model}: cosine of {len(PARAPHRASES)} paraphrase pairs, {len(DIFFERENT)} related-but-different "
          f"pairs and {len(NEAR_MISSES)} near-miss pairs (DUPLICATE_MIN_COSINE = {ranking.DUPLICATE_MIN_COSINE})")
    print(f"{'set':<12} {'min':>6} {'median':>6} {'max':>6} " + " ".join(f"{f'≥{t}':>6}" for t in THRESHOLDS))
    for name in sets:
        row = figures[name]
        print(f"{name:<12} {row['min']:>6.3f} {row['median']:>6.3f} {row['max']:>6.3f} "
              + " ".join(f"{row[f'at_least_{t}']:>6}" for t in THRESHOLDS))
    locomo = figures["locomo"]
    print(f"\n{'rule':<62} {'para merged':>11} {'diff merged':>11} {'near merged':>11} {'LoCoMo':>7}")
    for rule_name, row in confusion.items():
        print(f"{rule_name:<62} {row['paraphrases_merged']:>5} / {len(PARAPHRASES):<3} "
              f"{row['different_merged']:>5} / {len(DIFFERENT):<3} "
              f"{row['near_misses_merged']:>5} / {len(NEAR_MISSES):<3} "
              f"{locomo['merged_by_rule_at_cosine_0.7_or_more'][rule_name]:>7}")
    print("LoCoMo: pairs of one speaker's different turns (cosine ≥ 0.7) the rule merges")
    print(f"\nLoCoMo: {locomo['turns']:,} turns; pairs of one speaker's different turns at or above each cosine "
          "(in brackets: kept apart by the word rules / by the word rules and the value rule)")
    print("  " + ", ".join(f"≥{t}: {locomo['pairs_at_least'][t]} ({locomo['kept_apart_by_word_rules'][t]} / "
                           f"{locomo['kept_apart_with_value_rule'][t]})" for t in THRESHOLDS))
    for example in locomo["examples_at_current_threshold"][:8]:
        print(f"  {example['cosine']:.3f} {example['a'][:70]!r} / {example['b'][:70]!r}")
    vendor = "local" if args.embeddings == "local" else "model"
    print(f"wrote {write_results('duplicate_cosine', vendor, figures, args.out)}")
    return 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
    os.environ.setdefault("SECRET_KEY", "kinsite-bench-only-secret-key-not-for-deployments")
    import django

    django.setup()
    sys.exit(main())
