"""Synthetic data shared by the benchmarks: a word-rich vocabulary with a Zipf-like
skew, memories built from it (bench/memory_search.py, bench/prompt_build.py) and a long
multi-user session of messages from the same words (bench/prompt_build.py)."""
import random
import time
from datetime import datetime, timedelta
from itertools import accumulate

# A synthetic but word-rich corpus: people, topics and details combine into
# sentences, with a Zipf-like skew so some words are common and most are rare.
PEOPLE = ["Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Lucas", "Sofia", "Ivan",
          "Chen", "Fatima", "Jonas", "Amara", "Diego", "Hana", "Noah", "Zara", "Mateo", "Yuki"]
TOPICS = """invoice report deployment database migration dashboard budget hiring roadmap contract
customer export pipeline backup release onboarding pricing newsletter survey audit incident
forecast warehouse inventory shipping payroll training workshop interview launch campaign
vendor license server cluster queue cache schema index query latency outage rollback feature
design review meeting retro sprint ticket bug patch security password token permission""".split()
DETAILS = """monday tuesday wednesday thursday friday weekly monthly quarterly yearly urgent
postgres redis celery django python csv json excel slack email telegram discord whatsapp
berlin london tokyo lagos lima toronto sydney mumbai paris cairo short long formal casual
green blue red coffee tea vegan spicy morning evening remote office hybrid metric imperial""".split()
TEMPLATES = [
    "{p} prefers {d} updates about the {t}",
    "The {t} for {p} is due every {d}",
    "{p} decided to move the {t} to {d}",
    "{p} owns the {t} and reviews it on {d}",
    "Remember that the {t} uses {d} and {d2}",
    "{p} asked to keep {t} answers {d}",
    "Team agreed the {t} {t2} happens {d}",
    "{p} knows the {t} runbook for {d2} {d}",
]
CATEGORIES = ["fact", "preference", "decision", "knowledge"]

# Rank r weighs 1/r. Cumulative weights are computed once; random.choices draws the
# same word from them as from the plain weights, so seeded runs are unchanged.
_ZIPF_CUMULATIVE = {}


def zipf_choice(rng: random.Random, words: list[str]) -> str:
    # Rank r is drawn with weight 1/r: a handful of words dominate, as in real notes.
    cumulative = _ZIPF_CUMULATIVE.get(id(words))
    if cumulative is None:
        cumulative = _ZIPF_CUMULATIVE[id(words)] = list(accumulate(1 / (rank + 1) for rank in range(len(words))))
    return rng.choices(words, cum_weights=cumulative)[0]


def sentence(rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(
        p=rng.choice(PEOPLE), t=zipf_choice(rng, TOPICS), t2=zipf_choice(rng, TOPICS),
        d=zipf_choice(rng, DETAILS), d2=zipf_choice(rng, DETAILS),
    )


def message_text(rng: random.Random, *, min_words: int, max_words: int) -> str:
    """A chat message of min_words..max_words words: sentences of the vocabulary, the last one cut."""
    target = rng.randint(min_words, max_words)
    words: list[str] = []
    while len(words) < target:
        words.extend((sentence(rng) + ".").split())
    text = " ".join(words[:target])
    return text if text.endswith(".") else text + "."


def memories_populate(*, kins: int, per_kin: int, seed: int, team=None, embed=None):
    """A team (created unless given) with `kins` kins of `per_kin` memories each, updated_at
    spread over a year. `embed(text) -> (float32 bytes, model)`, when given, stores a vector
    with each. Returns (team, kins, load seconds)."""
    from django.utils import timezone

    from kinsite.services import team_create
    from memories.models import Memory, MemoryVector
    from sessions_app.services import kin_create

    rng = random.Random(seed)
    team = team or team_create(name="Bench team", slug="bench")
    kin_rows = [kin_create(team=team, name=f"Kin {n}") for n in range(kins)]
    now = timezone.now()
    started = time.monotonic()
    for kin in kin_rows:
        # Rows are inserted directly: the benchmarks measure reads, and the services'
        # duplicate check would make loading 100,000 rows take minutes.
        rows = [
            Memory(
                team=team, kin=kin, category=rng.choice(CATEGORIES), content=sentence(rng),
                subject=rng.choice(PEOPLE), importance=rng.randint(1, 10), source="api",
            )
            for _ in range(per_kin)
        ]
        vectors = {}
        if embed is not None:
            for index, row in enumerate(rows):
                vectors[index], row.embedding_model = embed(row.content)
        Memory.objects.bulk_create(rows, batch_size=2000)
        if vectors:
            MemoryVector.objects.bulk_create(
                [MemoryVector(memory_id=rows[index].pk, vector=vector) for index, vector in vectors.items()],
                batch_size=2000,
            )
    # Spread updated_at over a year so recency decay has work to do.
    ids = list(Memory.objects.filter(team=team).values_list("id", flat=True))
    for start in range(0, len(ids), 5000):
        chunk = ids[start:start + 5000]
        Memory.objects.filter(id__in=chunk).update(updated_at=now - timedelta(days=rng.randint(0, 365)))
    return team, kin_rows, time.monotonic() - started


# The people of the benchmark session and where each of them writes from.
SESSION_USERS = (("Maria", "web"), ("Tom", "telegram"), ("Aisha", "slack"))


def session_populate(*, kin, messages: int, seed: int, weeks: int = 6, now: datetime | None = None,
                     min_words: int = 10, max_words: int = 80):
    """One session of `kin` with `messages` messages, alternating a user (one of
    SESSION_USERS) and the kin's reply, spread over `weeks` weeks up to `now`, each with
    its tiktoken count as a turn stores it. Returns (session, load seconds)."""
    from django.utils import timezone

    from kinsite.tokencount import count_tokens
    from sessions_app.models import Event
    from sessions_app.services import session_create

    rng = random.Random(seed)
    now = now or timezone.now()
    session = session_create(kin=kin, title="Bench session")
    started = time.monotonic()
    exchanges = (messages + 1) // 2
    # Exchanges come at random moments of the period (sorted), the reply 5-60 s after its question.
    span = timedelta(weeks=weeks).total_seconds()
    moments = sorted(rng.uniform(0, span - 120) for _ in range(exchanges))
    start = now - timedelta(seconds=span)
    rows = []
    for index in range(messages):
        moment = start + timedelta(seconds=moments[index // 2])
        text = message_text(rng, min_words=min_words, max_words=max_words)
        if index % 2 == 0:
            sender, platform = rng.choice(SESSION_USERS)
            rows.append(Event(session=session, kind=Event.Kind.MESSAGE, role=Event.Role.USER, content=text,
                              sender=sender, platform=platform, created_at=moment))
        else:
            reply_at = moment + timedelta(seconds=rng.randint(5, 60))
            rows.append(Event(session=session, kind=Event.Kind.MESSAGE, role=Event.Role.ASSISTANT, content=text,
                              sender=kin.name, platform=platform, created_at=reply_at))
    for row in rows:
        row.token_count = count_tokens(row.content)
    Event.objects.bulk_create(rows, batch_size=2000)
    return session, time.monotonic() - started
