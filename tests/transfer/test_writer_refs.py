"""An imported kin's writer texts and change snapshots (transfer.format's docstring): what
named the exported kin, its memories, messages and turns names the imported ones; what names
the source installation (tokens, users, runs) stays as it was; a document of an older
version's source_ref shapes imports in the current format, and any other shape is refused."""
import json
import re
import uuid

import pytest
from django.urls import reverse

from consolidation.models import Fact
from consolidation.services import fact_record
from memories import services
from memories.models import Memory, MemoryChange
from tests.factories import SessionFactory, TurnFactory
from transfer.selectors import kin_export_document
from transfer.services import DocumentInvalid, kin_import

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"transfer-refs-{uuid.uuid4()}"}}


@pytest.fixture
def written_by_a_turn(kin):
    """A memory a turn wrote (as sessions_app.turns does), superseded by a newer one an API
    token wrote, and a fact from the same turn."""
    session = SessionFactory(kin=kin)
    turn = TurnFactory(session=session)
    message = turn.user_message
    turn_actor = services.Actor(f"kin:{kin.pk} turn:{turn.pk}")
    old = services.memory_add(team=kin.team, kin=kin, content="Maria drinks tea", actor=turn_actor,
                              source=Memory.Source.TURN, source_ref=f"event:{message.pk}").memory
    new = services.memory_add(team=kin.team, kin=kin, content="Maria drinks green tea with lemon every day",
                              actor=services.Actor("token:ks_ab12"), source=Memory.Source.API,
                              source_ref="token:ks_ab12").memory
    services.memory_supersede(memory=old, actor=turn_actor, reason="newer", superseded_by=new)
    fact_record(kin=kin, statement="Maria drinks tea", source=Fact.Source.TOOL, source_ref=f"event:{message.pk}")
    return {"old": old, "new": new, "turn": turn, "message": message}


def as_json(document):
    return json.loads(json.dumps(document))


def test_with_sessions_every_carried_row_is_named_by_its_new_id(kin, other_team, written_by_a_turn):
    document = as_json(kin_export_document(kin=kin, include_sessions=True))

    imported = kin_import(team=other_team, document=document).kin

    new_turn = imported.sessions.get().turns.get()
    new_message = new_turn.user_message
    old, new = (Memory.objects.get(kin=imported, content=m.content) for m in (written_by_a_turn["old"],
                                                                              written_by_a_turn["new"]))
    assert old.source_ref == f"event:{new_message.pk}" != f"event:{written_by_a_turn['message'].pk}"
    assert new.source_ref == "token:ks_ab12"  # the source installation's token: verbatim
    assert Fact.objects.get(kin=imported).source_ref == f"event:{new_message.pk}"
    add, supersede = MemoryChange.objects.filter(memory=old).order_by("id")
    assert add.actor == supersede.actor == f"kin:{imported.pk} turn:{new_turn.pk}"
    assert add.after["kin"] == imported.pk and supersede.before["kin"] == imported.pk
    assert supersede.after["superseded_by"] == new.pk != written_by_a_turn["new"].pk
    assert MemoryChange.objects.get(memory=new).after["kin"] == imported.pk


def test_without_sessions_the_kin_is_renamed_and_messages_keep_their_source_ids(kin, other_team, written_by_a_turn):
    document = as_json(kin_export_document(kin=kin, include_sessions=False))

    imported = kin_import(team=other_team, document=document).kin

    old = Memory.objects.get(kin=imported, content=written_by_a_turn["old"].content)
    assert old.source_ref == f"event:{written_by_a_turn['message'].pk}"  # not carried: the source's row
    add = MemoryChange.objects.filter(memory=old).order_by("id").first()
    assert add.actor == f"kin:{imported.pk} turn:{written_by_a_turn['turn'].pk}"
    assert add.after["kin"] == imported.pk


def test_the_dashboard_history_of_an_imported_memory_shows_the_new_kin(client, user, team, kin, written_by_a_turn):
    imported = kin_import(team=team, document=as_json(kin_export_document(kin=kin, include_sessions=True))).kin
    memory = Memory.objects.get(kin=imported, content=written_by_a_turn["new"].content)
    client.force_login(user)

    page = client.get(reverse("dashboard:memory_detail", args=[imported.pk, memory.pk])).content.decode()

    # The add row's diff lists the kin it was added to.
    assert re.findall(r'<th>kin</th>\s*<td class="after text">(\d+)</td>', page) == [str(imported.pk)]


def test_older_source_ref_shapes_import_in_the_current_format(kin, other_team):
    services.memory_add(team=kin.team, kin=kin, content="Invoices go out monthly", actor=services.Actor("token:ks_x"),
                        source_ref="token:ks_x")
    services.memory_add(team=kin.team, kin=kin, content="The demo office is in Leeds", actor=services.Actor("x:y"),
                        source=Memory.Source.ADMIN, source_ref="command:create_demo")
    document = as_json(kin_export_document(kin=kin, include_sessions=False))
    for row in document["memories"]:  # as an export made before the one writer format
        row["source_ref"] = {"token:ks_x": "ks_x", "command:create_demo": "create_demo"}[row["source_ref"]]

    imported = kin_import(team=other_team, document=document).kin

    assert sorted(imported.memories.values_list("source_ref", flat=True)) == ["command:create_demo", "token:ks_x"]


@pytest.mark.parametrize("section", ["memories", "facts"])
def test_a_source_ref_of_no_known_shape_is_refused_by_path(kin, other_team, section):
    services.memory_add(team=kin.team, kin=kin, content="Invoices go out monthly", actor=services.Actor("token:ks_x"))
    fact_record(kin=kin, statement="Invoices go out monthly", source=Fact.Source.API, source_ref="token:ks_x")
    document = as_json(kin_export_document(kin=kin, include_sessions=False))
    document[section][0]["source_ref"] = "somebody said so"
    before = (Memory.objects.count(), Fact.objects.count())

    with pytest.raises(DocumentInvalid) as raised:
        kin_import(team=other_team, document=document)

    assert raised.value.details["errors"][0]["path"] == f"{section}[0].source_ref"
    assert "<kind>:<value>" in raised.value.details["errors"][0]["message"]
    assert (Memory.objects.count(), Fact.objects.count()) == before
