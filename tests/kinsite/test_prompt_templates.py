"""Prompt templates (SPEC §8 "Templates"): resolution explicit → kin → team → default,
named placeholders only (unknown names, positional fields, attribute/index access,
conversions and format specs are refused, each error saying where), rendering that never
reaches into values, the built-in defaults, and the admin's validation and preview."""
import string

import pytest
from django.urls import reverse

from kinsite.errors import InvalidInput
from kinsite.models import PromptTemplate
from kinsite.prompt_template_kinds import (
    KINDS,
    template_default,
    template_headings,
    template_placeholders,
    template_sample_values,
)
from kinsite.prompt_templates import (
    TemplateError,
    template_fields,
    template_render,
    template_resolve,
    template_validate,
)
from tests.factories import KinFactory, PromptTemplateFactory, UserFactory

COMPACTION, CONSOLIDATION, INTROSPECTION = "compaction", "consolidation", "introspection"


def make_template(team, *, kin=None, kind=CONSOLIDATION, body="Team body {max_words}", active=True, name="t"):
    return PromptTemplateFactory(team=team, kin=kin, kind=kind, name=name, body=body, is_active=active)


# --- resolution ----------------------------------------------------------------------------


@pytest.mark.django_db
class TestResolution:
    def test_built_in_default_when_nothing_is_stored(self, kin):
        resolved = template_resolve(kind=CONSOLIDATION, kin=kin)
        assert (resolved.body, resolved.source, resolved.template_id) == (
            template_default(CONSOLIDATION), "default", None,
        )

    def test_team_template_beats_the_default(self, kin, team):
        team_template = make_template(team)
        resolved = template_resolve(kind=CONSOLIDATION, kin=kin)
        assert (resolved.body, resolved.source, resolved.template_id) == (team_template.body, "team", team_template.pk)

    def test_kin_template_beats_the_team_template(self, kin, team):
        make_template(team)
        kin_template = make_template(team, kin=kin, body="Kin body {max_words}")
        resolved = template_resolve(kind=CONSOLIDATION, kin=kin)
        assert (resolved.body, resolved.source, resolved.template_id) == (
            "Kin body {max_words}", "kin", kin_template.pk
        )

    def test_explicit_body_beats_everything(self, kin, team):
        make_template(team)
        make_template(team, kin=kin, body="Kin body")
        resolved = template_resolve(kind=CONSOLIDATION, kin=kin, explicit_body="Explicit {max_words}")
        assert (resolved.body, resolved.source, resolved.template_id) == ("Explicit {max_words}", "explicit", None)

    def test_inactive_templates_are_ignored(self, kin, team):
        make_template(team, kin=kin, body="Old kin body", active=False)
        assert template_resolve(kind=CONSOLIDATION, kin=kin).source == "default"
        make_template(team, body="Old team body", active=False, name="old")
        assert template_resolve(kind=CONSOLIDATION, kin=kin).source == "default"
        team_template = make_template(team, body="Live team body", name="live")
        resolved = template_resolve(kind=CONSOLIDATION, kin=kin)
        assert (resolved.source, resolved.template_id) == ("team", team_template.pk)

    def test_other_kinds_and_other_kins_are_ignored(self, kin, team):
        make_template(team, kind=COMPACTION, body="Compaction {transcript}")
        make_template(team, kin=KinFactory(team=team), body="Sibling's body")
        assert template_resolve(kind=CONSOLIDATION, kin=kin).source == "default"

    def test_another_teams_templates_are_never_used(self, kin, other_team):
        make_template(other_team, body="Other team's body")
        other_kin = KinFactory(team=other_team)
        make_template(other_team, kin=other_kin, body="Other kin's body")
        # Even a row that names our kin under another team (inconsistent data) is not used.
        make_template(other_team, kin=kin, body="Smuggled body", name="smuggled")
        resolved = template_resolve(kind=CONSOLIDATION, kin=kin)
        assert (resolved.source, resolved.body) == ("default", template_default(CONSOLIDATION))

    def test_resolution_is_one_query(self, kin, team, django_assert_num_queries):
        make_template(team)
        make_template(team, kin=kin, body="Kin body")
        with django_assert_num_queries(1):
            assert template_resolve(kind=CONSOLIDATION, kin=kin).source == "kin"

    def test_unknown_kind_is_a_programming_error(self, kin):
        with pytest.raises(ValueError, match="Unknown prompt template kind"):
            template_resolve(kind="poetry", kin=kin)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("Limit {max_wrds} words.", "unknown placeholder {max_wrds} (did you mean {max_words}?)"),
        ("Hi {user_password}", "unknown placeholder {user_password}"),
        ("{max_words.__class__}", "reaches into an attribute or item"),
        ("{kin_name.__init__.__globals__}", "reaches into an attribute or item"),
        ("{pending_facts[0]}", "reaches into an attribute or item"),
        ("{x[0]}", "reaches into an attribute or item"),
        ("{0}", "positional placeholder {0}"),
        ("{:>10}", "positional placeholder {:>10}"),
        ("{max_words!r}", "has a conversion (!r)"),
        ("{max_words:>10}", "has a format spec (:>10)"),
        ("{max_words!s:>10}", "has a conversion (!s)"),
        ("{ max_words }", "is not a placeholder"),
        ("{% if max_words %}", "is not a placeholder"),
        ("{max_words", "'{' is not closed"),
        ("At most {max_words words.", "'{' is not closed"),
        ("   \n", "The template is empty."),
    ],
)
def test_validation_refuses(body, expected):
    errors = template_validate(CONSOLIDATION, body)
    assert len(errors) == 1
    assert expected in errors[0]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("Open { brace", "'{' is not closed"),
        ("{max_tool_calls", "'{' is not closed"),
        ("close } brace", "'}' without a matching '{'"),
        ('JSON like {"key": 1}', "is not a placeholder"),
    ],
)
def test_other_kinds_refuse_every_brace_that_is_not_a_placeholder(body, expected):
    [error] = template_validate(INTROSPECTION, body)
    assert expected in error and "write {{ and }} for literal braces" in error


def test_errors_say_where_and_how_to_write_literal_braces():
    body = "# Introspection\nAt most {max_tool_calls} calls.\nUse JSON like {\"key\": 1}.\n"
    [error] = template_validate(INTROSPECTION, body)
    assert error.startswith("line 3, column 15:")
    assert "write {{ and }} for literal braces" in error
    [error] = template_validate(INTROSPECTION, "ok {max_tool_calls}\n  bad }")
    assert error.startswith("line 2, column 7:") and "{{ and }}" in error


# A consolidation template as written for "Experienced LLMs": only {max_words}, its own
# sections and a literal JSON example (nested, to show that braces balance).
EXPERIENCED = """You keep the experience document of an AI agent. Merge the new facts into it.
Stay under {max_words} words. Keep these sections:

# Master AI Experience
## 1. User Directives & Preferences
## 2. Defensive Safeguards & Heuristics

Return JSON only, for example:
{
  "updated_experience_markdown": "# Master AI Experience\\n## 1. User Directives & Preferences\\n- Use pnpm.",
  "processed_pending_ids": [12, 13],
  "superseded_fact_ids": [],
  "summary_of_changes": "Added the pnpm rule.",
  "example_of_nesting": {"a": {"b": [1, {"c": 2}]}}
}
"""


def test_a_consolidation_template_takes_a_json_example_as_literal_text():
    assert template_validate(CONSOLIDATION, EXPERIENCED) == []
    rendered = template_render(CONSOLIDATION, EXPERIENCED, {"max_words": 800})
    assert rendered == EXPERIENCED.replace("{max_words}", "800")


@pytest.mark.parametrize("literal", [
    '{"a": 1}', '{"a": {"b": [1, {"c": 2}]}}', "{a: 1}", "{1, 2}", "a } alone", "an { alone",
    '{\n  "key": "value"\n}', "{#}", "{'quoted': 1}", "{}", "{ }",
])
def test_consolidation_braces_that_are_not_a_placeholder_are_literal(literal):
    body = f"Use {literal} in at most {{max_words}} words."
    assert template_validate(CONSOLIDATION, body) == []
    expected = f"Use {literal} in at most 800 words."
    assert template_render(CONSOLIDATION, body, {"max_words": 800}) == expected


def test_consolidation_templates_written_with_doubled_braces_render_as_before():
    body = '{{"words": {max_words}, "nested": {{"a": 1}}}} and }}{{'
    assert template_render(CONSOLIDATION, body, {"max_words": 9}) == '{"words": 9, "nested": {"a": 1}} and }{'


def test_consolidation_placeholders_inside_a_json_example_are_filled():
    body = '{"summary": "at most {max_words} words", "kin": "{kin_name}"}'
    assert template_render(CONSOLIDATION, body, {"max_words": 5, "kin_name": "Ada"}) == (
        '{"summary": "at most 5 words", "kin": "Ada"}'
    )


def test_template_fields_are_the_placeholders_a_body_uses():
    assert template_fields(CONSOLIDATION, EXPERIENCED) == {"max_words"}
    assert template_fields(CONSOLIDATION, template_default(CONSOLIDATION)) == set(template_placeholders(CONSOLIDATION))


def test_every_problem_is_reported_with_its_position():
    errors = template_validate(CONSOLIDATION, "{nope} and {max_words:d}\n{kin_name.x}")
    assert [error.split(":")[0] for error in errors] == ["line 1, column 1", "line 1, column 12", "line 2, column 1"]


def test_unknown_placeholder_error_lists_what_the_kind_allows():
    [error] = template_validate(COMPACTION, "{max_words}")
    assert "a compaction template may use" in error
    for name in template_placeholders(COMPACTION):
        assert "{" + name + "}" in error


def test_placeholders_are_per_kind():
    assert template_validate(CONSOLIDATION, "{max_words}") == []
    assert template_validate(INTROSPECTION, "{max_words}") != []
    assert template_validate(INTROSPECTION, "{max_tool_calls} {events}") == []


# --- rendering -----------------------------------------------------------------------------


def test_render_with_literal_braces():
    body = 'Answer {{"words": {max_words}}} for {kin_name}; {{{kin_name}}} and }}{{'
    assert template_render(CONSOLIDATION, body, {"max_words": 1200, "kin_name": "Ada"}) == (
        'Answer {"words": 1200} for Ada; {Ada} and }{'
    )


def test_values_are_pasted_as_text_not_parsed_again():
    body = "Facts:\n{pending_facts}"
    value = "- {max_words.__class__} and {0} and {{ and }"
    assert template_render(CONSOLIDATION, body, {"pending_facts": value}) == "Facts:\n" + value


class Probe(str):
    """A value that records any attempt to look into it."""

    touched: list[str] = []

    @property
    def secret(self):
        Probe.touched.append("secret")
        return "SECRET"

    def __format__(self, spec):
        Probe.touched.append("__format__")
        return "FORMATTED"

    def __str__(self):
        Probe.touched.append("__str__")
        return "STR"


def test_rendering_cannot_reach_attributes_of_values():
    Probe.touched = []
    probe = Probe("Ada")
    with pytest.raises(TemplateError) as raised:
        template_render(CONSOLIDATION, "{kin_name.secret}", {"kin_name": probe})
    assert "reaches into an attribute" in raised.value.errors[0]
    assert template_render(CONSOLIDATION, "I am {kin_name}.", {"kin_name": probe}) == "I am Ada."
    assert Probe.touched == []


def test_values_other_than_str_and_int_are_refused():
    class Kin:
        name = "Ada"

    with pytest.raises(TypeError, match=r"\{kin_name\} must be str or int"):
        template_render(CONSOLIDATION, "{kin_name}", {"kin_name": Kin()})


def test_invalid_template_and_missing_values_raise_a_clear_400_error():
    with pytest.raises(TemplateError) as raised:
        template_render(CONSOLIDATION, "{max_words} {nope}", {"max_words": 5})
    assert isinstance(raised.value, InvalidInput) and raised.value.status == 400
    assert "unknown placeholder {nope}" in raised.value.message
    assert raised.value.details["errors"] == raised.value.errors
    with pytest.raises(TemplateError, match=r"No value for \{current_experience\}, \{pending_facts\}"):
        template_render(CONSOLIDATION, "{pending_facts} {current_experience}", {})


def test_unused_values_are_fine():
    assert template_render(CONSOLIDATION, "{max_words}", {"max_words": 9, "kin_name": "Ada"}) == "9"


# --- the built-in defaults -----------------------------------------------------------------


def used_names(body: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(body) if field is not None}


@pytest.mark.parametrize("kind", [COMPACTION, CONSOLIDATION, INTROSPECTION])
def test_each_default_validates_and_renders_with_sample_values(kind):
    body = template_default(kind)
    assert template_validate(kind, body) == []
    # Every allowed placeholder is used by the default and has a sample value.
    assert used_names(body) == set(template_placeholders(kind)) == set(template_sample_values(kind))
    rendered = template_render(kind, body, template_sample_values(kind))
    assert "{" + next(iter(template_placeholders(kind))) + "}" not in rendered
    assert "Ada" in rendered


def test_placeholder_sets_of_the_defaults():
    assert set(template_placeholders(CONSOLIDATION)) == {
        "max_words", "current_experience", "pending_facts", "active_facts", "kin_name",
    }
    assert set(template_placeholders(INTROSPECTION)) == {
        "kin_name", "working_memory", "description", "events", "max_tool_calls",
    }
    assert {"kin_name", "transcript", "previous_block"} <= set(template_placeholders(COMPACTION))
    assert set(KINDS) == set(PromptTemplate.Kind.values)


def test_consolidation_default_asks_for_the_rules_sections_and_json():
    rendered = template_render(CONSOLIDATION, template_default(CONSOLIDATION), template_sample_values(CONSOLIDATION))
    assert template_headings(template_default(CONSOLIDATION)) == [
        "# Master AI Experience",
        "## 1. User Directives & Preferences",
        "## 2. Defensive Safeguards & Heuristics",
        "## 3. Project-Specific Constraints",
        "## 4. Anti-Patterns & Critical Gotchas",
        "## 5. Mistake Corrections & Fixes",
    ]
    for phrase in ("de-duplication", "newer fact wins", "superseded_fact_ids", "At most 1200 words",
                   "No HTML comments", "no timestamps", "no filler"):
        assert phrase in rendered
    for key in ("updated_experience_markdown", "processed_pending_ids", "superseded_fact_ids", "summary_of_changes"):
        assert f'"{key}"' in rendered
    assert "{\n" in rendered and "\n}" in rendered  # the JSON braces came out single


def test_introspection_default_asks_in_order_and_allows_nothing():
    rendered = template_render(INTROSPECTION, template_default(INTROSPECTION), template_sample_values(INTROSPECTION))
    order = [rendered.index(tool) for tool in ("memory_recall", "memory_add", "memory_update", "memory_delete",
                                                 "working_memory_update", "session_description_update",
                                                 "Nothing worth storing")]
    assert order == sorted(order)
    assert "at most 10 tool calls" in rendered
    assert "Only if the state of the task" in rendered


# --- admin ---------------------------------------------------------------------------------


@pytest.fixture
def staff_client(client):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def admin_post(client, url, **fields):
    data = {"kin": "", "is_active": "on", "name": "Tight", "kind": CONSOLIDATION, **fields}
    if not data["is_active"]:
        del data["is_active"]
    return client.post(url, data)


def add_url():
    return reverse("admin:kinsite_prompttemplate_add")


@pytest.mark.django_db
class TestAdmin:
    def test_invalid_template_shows_the_error_and_stores_nothing(self, staff_client, team):
        response = admin_post(staff_client, add_url(), team=team.pk, body="At most {max_words.__class__} words.")
        assert response.status_code == 200
        page = response.content.decode()
        assert "reaches into an attribute or item" in page
        assert "errorlist" in page
        assert not PromptTemplate.objects.exists()

    def test_unbalanced_brace_error_tells_how_to_write_literal_braces(self, staff_client, team):
        response = admin_post(staff_client, add_url(), team=team.pk, kind=INTROSPECTION,
                              body="JSON: {\"a\": {max_tool_calls}}")
        assert "write {{ and }} for literal braces" in response.content.decode()
        assert not PromptTemplate.objects.exists()

    def test_valid_template_saves(self, staff_client, team, kin):
        response = admin_post(staff_client, add_url(), team=team.pk, kin=kin.pk, body="Under {max_words} words.")
        assert response.status_code == 302
        template = PromptTemplate.objects.get()
        assert (template.team, template.kin, template.body, template.is_active) == (
            team, kin, "Under {max_words} words.", True,
        )
        assert template_resolve(kind=CONSOLIDATION, kin=kin).template_id == template.pk

    def test_kin_of_another_team_is_refused(self, staff_client, team, other_team):
        stranger = KinFactory(team=other_team)
        response = admin_post(staff_client, add_url(), team=team.pk, kin=stranger.pk, body="{max_words}")
        assert response.status_code == 200
        assert f"belongs to team {other_team}" in response.content.decode()
        assert not PromptTemplate.objects.exists()

    def test_second_active_template_in_a_scope_is_refused_readably(self, staff_client, team):
        make_template(team, name="First")
        response = admin_post(staff_client, add_url(), team=team.pk, body="{max_words}", name="Second")
        assert response.status_code == 200
        page = response.content.decode()
        assert "“First” is already the active consolidation template" in page
        assert "Constraint" not in page  # the model's generic constraint message is not shown too
        assert PromptTemplate.objects.count() == 1
        response = admin_post(staff_client, add_url(), team=team.pk, body="{max_words}", name="Second",
                              is_active="")
        assert response.status_code == 302

    def test_activate_action_replaces_the_active_template_of_the_scope(self, staff_client, team):
        first = make_template(team, name="First")
        second = make_template(team, name="Second", active=False)
        staff_client.post(reverse("admin:kinsite_prompttemplate_changelist"),
                          {"action": "activate", "_selected_action": [second.pk]})
        first.refresh_from_db()
        second.refresh_from_db()
        assert (first.is_active, second.is_active) == (False, True)
        staff_client.post(reverse("admin:kinsite_prompttemplate_changelist"),
                          {"action": "deactivate", "_selected_action": [second.pk]})
        second.refresh_from_db()
        assert second.is_active is False

    def test_templates_are_deactivated_not_deleted(self, staff_client, team):
        template = make_template(team)
        response = staff_client.post(reverse("admin:kinsite_prompttemplate_delete", args=[template.pk]),
                                     {"post": "yes"})
        assert response.status_code == 403
        assert PromptTemplate.objects.filter(pk=template.pk).exists()

    def test_preview_renders_with_sample_values_escaped(self, staff_client, team):
        template = make_template(team, body="<b>{kin_name}</b> keeps {max_words} words. {{literal}}")
        page = staff_client.get(reverse("admin:kinsite_prompttemplate_change", args=[template.pk])).content.decode()
        assert '<pre class="prompt-preview"' in page
        preview = page.split('<pre class="prompt-preview"', 1)[1].split("</pre>", 1)[0]
        assert "&lt;b&gt;Ada&lt;/b&gt; keeps 1200 words. {literal}" in preview
        assert "<b>" not in preview
        # The kind's placeholders are listed beside the body.
        assert "<code>{pending_facts}</code>" in page

    def test_a_consolidation_template_with_a_json_example_saves_and_previews(self, staff_client, team):
        response = admin_post(staff_client, add_url(), team=team.pk, body=EXPERIENCED)
        assert response.status_code == 302
        template = PromptTemplate.objects.get()
        page = staff_client.get(reverse("admin:kinsite_prompttemplate_change", args=[template.pk])).content.decode()
        preview = page.split('<pre class="prompt-preview"', 1)[1].split("</pre>", 1)[0]
        assert "Stay under 1200 words." in preview
        assert "{&quot;a&quot;: {&quot;b&quot;: [1, {&quot;c&quot;: 2}]}}" in preview

    def test_add_page_can_start_from_the_built_in_default(self, staff_client):
        page = staff_client.get(add_url() + "?kind=compaction").content.decode()
        assert "Open threads" in page and "{transcript}" in page
