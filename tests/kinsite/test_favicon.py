"""The favicon: linked from the dashboard and the admin, and /favicon.ico answers."""
import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db

ICON_LINK = '<link rel="icon" href="/static/kinsite/favicon.svg" type="image/svg+xml">'


def test_favicon_ico_redirects_to_the_svg_which_is_served(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"] == "/static/kinsite/favicon.svg"
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    assert icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content)


def test_dashboard_pages_link_the_favicon(client, user, team):
    assert ICON_LINK in client.get(reverse("login")).content.decode()
    client.force_login(user)
    assert ICON_LINK in client.get(reverse("dashboard:kins")).content.decode()


def test_admin_pages_link_the_favicon_and_keep_their_header(client, admin_user):
    login_page = client.get(reverse("admin:login")).content.decode()
    assert ICON_LINK in login_page
    client.force_login(admin_user)
    index = client.get(reverse("admin:index")).content.decode()
    assert ICON_LINK in index
    assert 'id="site-name"' in index
    # Pages that add their own head content (a change form's scripts) keep the icon too.
    change_form = client.get(reverse("admin:auth_user_change", args=[admin_user.pk])).content.decode()
    assert ICON_LINK in change_form and "jsi18n" in change_form
