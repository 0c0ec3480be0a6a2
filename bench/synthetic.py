"""Synthetic data shared by the benchmarks: a word-rich vocabulary with a Zipf-like
skew, memories built from it (bench/memory_search.py, bench/prompt_build.py) and a long
multi-user session of messages from the same words (bench/prompt_build.py)."""
import random
import time
from datetime import UTC, datetime, timedelta
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


# --- Growth data sets (bench/history_growth.py, bench/memory_growth.py, bench/growth.py) ---
# Loaded by COPY, as an import would write them: the tables kept by triggers
# (sessions_app 0008 message counts and 0018 search postings, memories 0012 term counts)
# are filled by their statement triggers, once per COPY statement.

HISTORY_VOCABULARY = 30_000
HISTORY_MESSAGE_WORDS = (5, 30)
HISTORY_KINDS = ("rare", "common", "name", "one_word", "many_words")
# Rank bands of the vocabulary (rank 1 is the most frequent word; rank r is drawn with
# weight 1/r): at 100,000 messages rank 1 is on about half the messages, rank 30 on ~3 %,
# rank 300 on ~0.3 %, rank 3,000 and beyond on a few dozen at most.
COMMON_RANKS = (1, 30)
MIDDLE_RANKS = (30, 1_000)
RARE_RANKS = (3_000, HISTORY_VOCABULARY)
MESSAGE_COPY_BATCH = 10_000

_HISTORY_SYLLABLES = [c + v for c in "bdfgklmnprtvz" for v in "aeiou"]


def history_vocabulary(rng: random.Random) -> list[str]:
    """HISTORY_VOCABULARY distinct made-up words of 2–4 syllables, most frequent first;
    never an English stop word, and distinct after stemming (they end in a vowel + 'x')."""
    words: set[str] = set()
    while len(words) < HISTORY_VOCABULARY:
        words.add("".join(rng.choice(_HISTORY_SYLLABLES) for _ in range(rng.randint(2, 4))) + "x")
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered


class HistoryCorpus:
    """Chat messages of 5–30 words drawn with weight 1/rank from a made-up vocabulary, and
    history-search queries by kind (HISTORY_KINDS)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.words = history_vocabulary(self.rng)
        self.cumulative = list(accumulate(1 / rank for rank in range(1, HISTORY_VOCABULARY + 1)))

    def message(self) -> str:
        count = self.rng.randint(*HISTORY_MESSAGE_WORDS)
        return " ".join(self.rng.choices(self.words, cum_weights=self.cumulative, k=count))

    def band(self, ranks: tuple[int, int], rng: random.Random) -> str:
        return self.words[rng.randrange(ranks[0] - 1, ranks[1])]

    def query(self, kind: str, rng: random.Random) -> str:
        if kind == "rare":
            return f"what did they say about {self.band(RARE_RANKS, rng)} and {self.band(COMMON_RANKS, rng)}"
        if kind == "common":
            return " ".join(self.band(COMMON_RANKS, rng) for _ in range(rng.randint(2, 3)))
        if kind == "name":
            return f"{rng.choice(PEOPLE)} {self.band(COMMON_RANKS, rng)}"
        if kind == "one_word":
            return self.band(MIDDLE_RANKS, rng)
        bands = (COMMON_RANKS, MIDDLE_RANKS, RARE_RANKS)
        return " ".join(self.band(bands[i % 3], rng) for i in range(12))


def messages_copy(session_id: int, count: int, corpus: HistoryCorpus) -> float:
    """`count` user messages from four speakers, 30 s apart, into a session by COPY in
    batches of MESSAGE_COPY_BATCH (the insert triggers run once per batch, as for an
    import), each with its tiktoken count as a turn stores it (the prompt's history
    selection adds them up). Returns the seconds it took."""
    from django.db import connection

    from kinsite.tokencount import count_tokens

    started = time.perf_counter()
    first = datetime(2026, 1, 1, tzinfo=UTC)
    columns = "session_id, kind, role, content, sender, platform, external_id, token_count, data, created_at"
    copy_sql = f"COPY sessions_app_event ({columns}) FROM STDIN"
    for start in range(0, count, MESSAGE_COPY_BATCH):
        with connection.cursor() as cursor, cursor.cursor.copy(copy_sql) as copy:
            for i in range(start, min(count, start + MESSAGE_COPY_BATCH)):
                text = corpus.message()
                copy.write_row((session_id, "message", "user", text, PEOPLE[i % 4], "api", f"m{i}",
                                count_tokens(text), "{}", first + timedelta(seconds=30 * i)))
    return time.perf_counter() - started


MEMORY_KINDS = ("rare", "common", "names", "one_word", "many_words")
RARE_CODES = 200_000
_CODE_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pu", "da", "fe", "gi", "ho", "ju"]


def rare_code(index: int) -> str:
    """A made-up word per index (base-15 syllables): 'kalomi', 'rutisa', ..."""
    parts = []
    for _ in range(5):
        index, digit = divmod(index, len(_CODE_SYLLABLES))
        parts.append(_CODE_SYLLABLES[digit])
    return "".join(parts) + "x"


def memory_text(rng: random.Random) -> str:
    """A sentence of the vocabulary and, on a third of the memories, a rare reference code."""
    text = sentence(rng)
    if rng.random() < 1 / 3:
        text += f", ref {rare_code(rng.randrange(RARE_CODES))}"
    return text


def memory_query(rng: random.Random, kind: str) -> str:
    """A memory-search query of a kind of MEMORY_KINDS."""
    if kind == "rare":
        return f"what about {rare_code(rng.randrange(RARE_CODES))} and the {rng.choice(TOPICS)}"
    if kind == "common":
        return sentence(rng)
    if kind == "names":
        return " and ".join(rng.sample(PEOPLE, rng.randint(1, 2)))
    if kind == "one_word":
        return rng.choice(TOPICS[:20])
    return message_text(rng, min_words=30, max_words=60)


def memories_copy(*, team, owners: list[tuple[int | None, int]], seed: int) -> dict:
    """Active memories of `team` by COPY: `owners` lists (kin id or None for team-shared,
    count). The kins' rows are shuffled together in the heap, as kins that are all active
    leave them (a load kin by kin keeps each kin's rows together and makes the GIN scans
    cheaper than they will be). The GIN indexes are dropped during the load and rebuilt
    after it, then VACUUM ANALYZE (outside a transaction). The term counters (memories
    0012) are kept by their statement trigger. The vector trigger (memories 0006, a row
    trigger) is off during the load and its work done once: a single-statement load into
    a new team gives every row of a scope generation 1 and the scope row generation 1,
    epoch 0, which is what the trigger would have written. Returns load seconds."""
    from django.db import connection
    from django.utils import timezone

    from memories.models import Memory, MemoryVectorScope

    if MemoryVectorScope.objects.filter(team_id=team.pk).exists():
        raise ValueError("memories_copy loads into a team without memories")
    rng = random.Random(seed)
    now = timezone.now()
    started = time.monotonic()
    table = Memory._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s "
                       "AND indexdef ILIKE '%%gin%%'", [table])
        gin_indexes = cursor.fetchall()
        try:
            for name, _ in gin_indexes:
                cursor.execute(f"DROP INDEX {name}")
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER memories_memory_vector_seq")
            columns = ("team_id, kin_id, category, content, subject, importance, status, source, source_ref, "
                       "retrieval_count, embedding_model, vector_seq, created_at, updated_at")
            owner_of_row = [kin_id for kin_id, count in owners for _ in range(count)]
            rng.shuffle(owner_of_row)
            with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for kin_id in owner_of_row:
                    moment = now - timedelta(days=rng.randint(0, 365), seconds=rng.randint(0, 86_400))
                    copy.write_row((team.pk, kin_id, rng.choice(CATEGORIES), memory_text(rng), rng.choice(PEOPLE),
                                    rng.randint(1, 10), "active", "api", "", 0, "", 1, moment, moment))
            cursor.execute(
                f"INSERT INTO {MemoryVectorScope._meta.db_table} (team_id, kin_key, generation, epoch) "
                f"SELECT DISTINCT team_id, coalesce(kin_id, 0), 1, 0 FROM {table} WHERE team_id = %s",
                [team.pk])
        finally:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER memories_memory_vector_seq")
            cursor.execute("SET maintenance_work_mem = '256MB'")
            for _, definition in gin_indexes:
                cursor.execute(definition)
        cursor.execute(f"VACUUM ANALYZE {table}")
    return {"memories": len(owner_of_row), "load_seconds": round(time.monotonic() - started, 1)}
