"""A failing model never shows where it lives: the internal model URL (LLM_BASE_URL) is in
the server log, not in the API's 502 bodies, the turn's stored error (read by members
through the API and the dashboard) or the LLM call log. The endpoint's path and its own
error text stay, since they say what went wrong."""
import logging

import pytest
from django.urls import reverse

from kinsite.llm.gateway import llm_chat, llm_embed
from kinsite.llm.openai_client import OpenAICompatibleProvider
from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError
from kinsite.models import LLMCall
from sessions_app.models import Turn
from tests.support.outbound import closed_port

pytestmark = pytest.mark.django_db


def provider_at(base_url: str, **options) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(base_url=base_url, model="m", embedding_model="e", timeout=0.3,
                                    max_retries=0, backoff=0.01, **options)


def hidden(text: str, base_url: str) -> bool:
    host = base_url.split("://", 1)[1].split("/", 1)[0]
    return base_url not in text and host not in text


FAULTS = {
    # The endpoint's own error text may echo its address (proxies do).
    "http error": lambda fake: fake.error(500, f"upstream {fake.base_url}/chat/completions failed"),
    "not json": lambda fake: fake.raw("<html>oops</html>"),
    "timeout": lambda fake: fake.stall(2),
}


@pytest.mark.parametrize("fault", FAULTS, ids=str)
def test_a_model_error_names_no_url_and_the_log_has_it(fault, fake_llm, caplog):
    provider = provider_at(fake_llm.base_url)
    FAULTS[fault](fake_llm)

    with caplog.at_level(logging.WARNING, logger="kinsite.llm"), pytest.raises(LLMError) as caught:
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=provider)

    assert hidden(caught.value.message, fake_llm.base_url), caught.value.message
    assert "/chat/completions" in caught.value.message
    assert hidden(LLMCall.objects.get().error, fake_llm.base_url)
    assert f"{fake_llm.base_url}/chat/completions" in caplog.text


def test_an_unreachable_endpoint_names_no_url(caplog):
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    with caplog.at_level(logging.WARNING, logger="kinsite.llm"), pytest.raises(LLMError) as caught:
        llm_chat(purpose="kin_turn", messages=[{"role": "user", "content": "hi"}], provider=provider_at(base_url))
    assert caught.value.message.startswith("Could not reach the model endpoint")
    assert hidden(caught.value.message, base_url), caught.value.message
    assert base_url in caplog.text


def test_an_embeddings_error_names_no_url(fake_llm):
    fake_llm.raw('{"data": "nothing"}', endpoint="embeddings", content_type="application/json")
    with pytest.raises(LLMError) as caught:
        llm_embed(purpose="memory_embed", texts=["a"], provider=provider_at(fake_llm.base_url))
    assert hidden(caught.value.message, fake_llm.base_url), caught.value.message


def test_a_turns_502_and_stored_error_name_no_url(api_client, client, user, chat_session, fake_llm):
    fake_llm.error(500, f"model at {fake_llm.base_url} is down")
    with provider_override(provider_at(fake_llm.base_url)):
        response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/", {"content": "Hello?"},
                                   format="json")

    assert response.status_code == 502
    assert hidden(response.content.decode(), fake_llm.base_url), response.content
    turn = Turn.objects.get()
    assert turn.status == Turn.Status.FAILED and "HTTP 500" in turn.error
    polled = api_client.get(f"/api/v1/turns/{turn.pk}/")
    assert polled.status_code == 200 and hidden(polled.content.decode(), fake_llm.base_url)
    client.force_login(user)
    page = client.get(reverse("dashboard:session_detail", args=[chat_session.pk]))
    assert "HTTP 500" in page.content.decode() and hidden(page.content.decode(), fake_llm.base_url)
