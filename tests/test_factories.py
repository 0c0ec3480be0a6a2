"""Every factory builds a valid row, and rows that belong together are built together."""
import pytest

from tests import factories


@pytest.mark.parametrize("factory_class", [
    getattr(factories, name) for name in dir(factories)
    if name.endswith("Factory") and name != "DjangoModelFactory" and hasattr(getattr(factories, name), "_meta")
])
@pytest.mark.django_db
def test_factory_builds_a_saved_row(factory_class):
    row = factory_class()

    assert row.pk is not None


@pytest.mark.django_db
def test_turn_message_belongs_to_its_session():
    turn = factories.TurnFactory()

    assert turn.user_message.session_id == turn.session_id


@pytest.mark.django_db
def test_summary_events_belong_to_its_session():
    summary = factories.SummaryFactory()

    assert summary.first_event.session_id == summary.last_event.session_id == summary.session_id


@pytest.mark.django_db
def test_node_run_node_belongs_to_its_run_workflow():
    node_run = factories.NodeRunFactory()

    assert node_run.node.workflow_id == node_run.run.workflow_id


@pytest.mark.django_db
def test_edge_nodes_belong_to_its_workflow():
    edge = factories.EdgeFactory()

    assert edge.source.workflow_id == edge.target.workflow_id == edge.workflow_id
    assert edge.source_id != edge.target_id


@pytest.mark.django_db
def test_kin_template_belongs_to_the_kin_team():
    kin = factories.KinFactory()

    template = factories.PromptTemplateFactory(kin=kin)

    assert template.team_id == kin.team_id
