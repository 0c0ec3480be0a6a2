"""The memory admin's change list fits a 1280 px wide window (issue 26): with long contents,
long subjects (a link among them) and long kin and team names, the page does not scroll sideways."""
import pytest
from playwright.sync_api import expect

from memories.models import Memory
from tests.browser.conftest import PASSWORD
from tests.factories import KinFactory, MembershipFactory, MemoryFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.browser

LONG_CONTENT = (
    "Maria prefers the quarterly churn report split by region (EMEA, APAC, Americas) with the "
    "enterprise accounts listed separately, sent on the first Monday of the month before the "
    "leadership sync, and she wants the raw numbers attached as a spreadsheet rather than pasted "
    "into the body of the email, see https://reports.example.com/churn/quarterly/2024-q3/emea-enterprise-accounts"
)
URL = "https://reports.example.com/churn/quarterly/2024-q3/emea-enterprise-accounts/export.xlsx"
LONG_SUBJECT = "Quarterly churn reporting preferences of the regional leadership team and its enterprise accounts"


def test_memory_changelist_fits_a_1280_px_window(page):
    team = TeamFactory(name="Customer Success Operations and Enterprise Accounts")
    staff = UserFactory(is_staff=True, is_superuser=True)
    MembershipFactory(team=team, user=staff, role="admin")
    kin = KinFactory(team=team, name="Research assistant for the customer success operations team")
    for n in range(4):
        MemoryFactory(
            team=team, kin=kin, content=f"{n}: {LONG_CONTENT}", subject=f"{LONG_SUBJECT} {n}",
            category=Memory.Category.PREFERENCE, source=Memory.Source.INTROSPECTION,
            source_ref=f"session:{n}/turn:{n}/introspection-run-with-a-long-reference-{'x' * 120}",
        )
    MemoryFactory(team=team, kin=kin, content=URL + " is where the churn reports live.", subject=URL)

    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto("/admin/login/")
    page.fill("#id_username", staff.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.goto("/admin/memories/memory/")
    expect(page.locator("#result_list tbody tr")).to_have_count(5)

    widths = page.evaluate("""() => {
        const results = document.querySelector("#changelist-form .results");
        return {page: document.documentElement.scrollWidth, window: window.innerWidth,
                results: results.scrollWidth, shown: results.clientWidth};
    }""")
    assert widths["window"] == 1280
    assert widths["page"] <= widths["window"], widths
    # Django's admin scrolls a too-wide result table inside its own box (overflow-x: auto)
    # rather than the page: that sideways scroll is the one to avoid.
    assert widths["results"] <= widths["shown"], widths
