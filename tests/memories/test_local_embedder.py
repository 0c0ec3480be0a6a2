"""The local embedder (kinsite.llm.local_embedder) with the real model, no fake: it computes
what sentence-transformers computes for all-MiniLM-L6-v2, finds a memory by meaning when the
query shares no word with it (service, API, recall tool), re-embeds when EMBEDDINGS goes
local → off → local, never touches the network, and a missing model stops the start."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kinsite.llm import local_embedder
from kinsite.tools import ToolContext
from memories import reembed, services
from memories.models import Memory
from memories.search.selectors import memory_search
from memories.services import Actor
from memories.tools import memory_toolset
from tests.support import fake_openai

pytestmark = pytest.mark.usefixtures("private_cache")

REPO = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).with_name("data") / "minilm_reference.json"
ACTOR = Actor(label="user:ada")
EMAIL = "The customer prefers e-mail over phone calls."
NOISE = ["The warehouse is in Leeds.", "Tom owns the quarterly budget report.",
         "The staging server runs in Frankfurt.", "Aisha reviews pull requests before lunch."]
# Shares no word (and no stem) with EMAIL.
QUERY = "How should we reach the client?"


@pytest.fixture
def local(settings):
    settings.EMBEDDINGS = "local"


@pytest.fixture
def no_network(monkeypatch):
    """Any connection to an address other than this machine's raises, for the whole process
    (the database and Redis listen on 127.0.0.1)."""
    real_connect = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access to {address!r} during a local embedding")
        return real_connect(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in ("127.0.0.1", "::1", "localhost", None):
            raise AssertionError(f"name lookup of {host!r} during a local embedding")
        return real_getaddrinfo(host, *args, **kwargs)

    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_the_vectors_are_those_of_sentence_transformers():
    """The reference vectors were computed once with sentence-transformers 6.3.0 (torch
    2.13.0, CPU) on the same weights: SentenceTransformer(model_dir).encode(texts,
    normalize_embeddings=True). Mean pooling over padding-free runs, so batch or single
    must agree too."""
    reference = json.loads(REFERENCE.read_text())
    texts = [row["text"] for row in reference]
    expected = np.array([row["vector"] for row in reference], dtype=np.float32)
    embedder = local_embedder.local_embedder()

    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([text])[0] for text in texts])

    assert together.shape == (len(texts), 384)
    assert np.abs(together - expected).max() < 1e-4
    assert np.abs(alone - expected).max() < 1e-4
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_a_long_text_is_cut_at_the_models_length_not_refused():
    embedder = local_embedder.local_embedder()
    long_text = "budget " * 2000
    [vector] = embedder.embed([long_text])
    assert np.isfinite(vector).all() and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


@pytest.mark.django_db
def test_a_query_sharing_no_word_finds_the_memory_by_meaning(local, no_network, team, kin, api_client, monkeypatch):
    monkeypatch.setattr(local_embedder, "_embedder", None)  # loaded again here, with the network blocked
    wanted = services.memory_add(team=team, kin=kin, content=EMAIL, actor=ACTOR).memory
    for text in NOISE:
        services.memory_add(team=team, kin=kin, content=text, actor=ACTOR)
    assert Memory.objects.filter(embedding_model=local_embedder.MODEL_NAME).count() == 1 + len(NOISE)

    hits = memory_search(team=team, kin=kin, query=QUERY, limit=3)
    assert hits and hits[0].memory.pk == wanted.pk
    assert hits[0].components["vector"] > 0 and hits[0].components["text"] == 0

    response = api_client.get(f"/api/v1/kins/{kin.pk}/memories/search/", {"q": QUERY, "limit": 3})
    assert response.status_code == 200, response.content
    assert response.json()["results"][0]["id"] == wanted.pk

    context = ToolContext(team=team, kin=kin, actor=Actor(label=f"kin:{kin.pk}"), source="tool", source_ref="")
    recalled = json.loads(memory_toolset("kin")["memory_recall"].handler(context, json.dumps({"query": QUERY})))
    assert recalled["memories"][0]["id"] == wanted.pk, recalled


@pytest.mark.django_db
def test_off_then_local_again_re_embeds_what_was_written_meanwhile(settings, team, kin,
                                                                   django_capture_on_commit_callbacks):
    settings.EMBEDDINGS = "local"
    first = services.memory_add(team=team, kin=kin, content=NOISE[0], actor=ACTOR).memory

    settings.EMBEDDINGS = "off"
    written_off = services.memory_add(team=team, kin=kin, content=EMAIL, actor=ACTOR).memory
    assert written_off.embedding_model == "" and reembed.reembed_check() is None
    # Off: words only, so the paraphrase is not found.
    assert [hit.memory.pk for hit in memory_search(team=team, kin=kin, query=QUERY)] == []

    settings.EMBEDDINGS = "local"
    with django_capture_on_commit_callbacks(execute=True):
        run = reembed.reembed_check()  # what beat does every five minutes; its task runs eagerly
    assert run is not None and run.model == local_embedder.MODEL_NAME and run.total == 1
    run.refresh_from_db()
    assert run.status == run.Status.DONE and run.done == 1
    written_off.refresh_from_db()
    first.refresh_from_db()
    assert written_off.embedding_model == first.embedding_model == local_embedder.MODEL_NAME
    assert written_off.vector is not None
    assert memory_search(team=team, kin=kin, query=QUERY)[0].memory.pk == written_off.pk


def test_a_missing_model_stops_the_start_saying_what_to_install(tmp_path):
    """A package of the model's name without its files (a broken install) stands first on
    the path: manage.py check fails with the start-up error instead of running without
    meaning."""
    fake = tmp_path / "shadow" / local_embedder.MODEL_PACKAGE
    (fake / "model").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    environment.update(DJANGO_SETTINGS_MODULE="kinsite.settings", KINSITE_DATA_DIR=str(tmp_path), DEBUG="true",
                       EMBEDDINGS="local", PYTHONPATH=str(tmp_path / "shadow"))
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=environment, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "EMBEDDINGS=local needs the local embedding model" in result.stderr, result.stderr[-2000:]
    assert "model.safetensors" in result.stderr and "requirements-model.txt" in result.stderr

    environment["EMBEDDINGS"] = "off"
    assert subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=environment,
                          capture_output=True, timeout=60).returncode == 0


@pytest.mark.django_db
@pytest.mark.parametrize(("first", "second"), [
    # Cosine 0.97 with this model, and too few words in common for the word rule.
    ("The team chose Postgres for the new billing service", "For the new billing service the team picked Postgres"),
    ("Alice relocated to Berlin in the spring", "In the spring Alice moved to Berlin"),
])
def test_two_paraphrases_merge_into_one_memory(local, team, kin, first, second):
    original = services.memory_add(team=team, kin=kin, content=first, actor=ACTOR).memory
    result = services.memory_add(team=team, kin=kin, content=second, actor=ACTOR)
    assert not result.created and result.memory.pk == original.pk
    assert Memory.objects.filter(team=team, status=Memory.Status.ACTIVE).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("first", "second"), [
    ("Option A is chosen", "Option B is chosen"),
    ("The release is on Tuesday", "The release is on Thursday"),
    ("We go camping next month", "We went camping last month"),
])
def test_a_near_miss_stays_a_memory_of_its_own(local, team, kin, first, second):
    services.memory_add(team=team, kin=kin, content=first, actor=ACTOR)
    result = services.memory_add(team=team, kin=kin, content=second, actor=ACTOR)
    assert result.created
    assert sorted(Memory.objects.filter(team=team).values_list("content", flat=True)) == sorted([first, second])


@pytest.mark.django_db
def test_a_turn_embeds_one_query_and_a_memory_write_one_text(local, team, kin, chat_session, api_client,
                                                              fake_llm_gateway, fake_llm, monkeypatch):
    """What embedding costs a chat turn (its memory search's query, nothing else: history is
    embedded in the background) and a memory write (once, though it also checks duplicates)."""
    embedder = local_embedder.local_embedder()
    calls = []
    real_embed = embedder.embed
    monkeypatch.setattr(embedder, "embed", lambda texts: calls.append(list(texts)) or real_embed(texts))
    services.memory_add(team=team, kin=kin, content=EMAIL, actor=ACTOR)
    assert calls == [[EMAIL]]

    calls.clear()
    fake_llm.reply("E-mail, as the customer prefers.")
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/",
                               {"content": QUERY, "sender": "Maria"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["turn"]["status"] == "done"
    assert len(calls) == 1 and len(calls[0]) == 1 and QUERY in calls[0][0], calls
    assert not fake_llm.requests_to(fake_openai.EMBEDDINGS)  # the endpoint serves the chat only
