"""kinsite.markdown: Markdown renders (headings, lists, emphasis, code, tables), and hostile
text comes out inert: no raw HTML, no script, no event or style attribute, no link but
http(s)/mailto, no image that loads anything."""
import re

import pytest
from django.utils.html import escape
from django.utils.safestring import SafeString

from kinsite import markdown
from kinsite.markdown import markdown_render

DOCUMENT = """# Master AI Experience
## 1. User Directives & Preferences
- Maria wants *short* answers and **bullet points**.
- Run `make report` first.

1. Check the date column.
2. Then the totals.

> Quoted advice.

```
SELECT * FROM churn WHERE email <> '';
```

| Report | Day |
|--------|----:|
| churn  | Mon |

~~Old rule~~"""


def hrefs(html: str) -> list[str]:
    return re.findall(r'href="([^"]*)"', html)


def tags(html: str) -> set[str]:
    return set(re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", html))


def test_headings_lists_emphasis_code_and_tables_render():
    html = markdown_render(DOCUMENT)

    assert isinstance(html, SafeString)
    assert "<h1>Master AI Experience</h1>" in html
    assert "<h2>1. User Directives &amp; Preferences</h2>" in html
    assert "<li>Maria wants <em>short</em> answers and <strong>bullet points</strong>.</li>" in html
    assert "<li>Run <code>make report</code> first.</li>" in html
    assert "<ol>\n<li>Check the date column.</li>" in html
    assert "<blockquote>\n<p>Quoted advice.</p>\n</blockquote>" in html
    assert "<pre><code>SELECT * FROM churn WHERE email &lt;&gt; &#x27;&#x27;;\n</code></pre>" in html
    assert "<th>Report</th>" in html and "<td>Mon</td>" in html
    assert "<s>Old rule</s>" in html


def test_script_and_raw_html_are_shown_as_text():
    html = markdown_render(
        '<script>alert("x")</script>\n\nText <b onclick="steal()">bold</b> <iframe src="https://e.com"></iframe>\n\n'
        '<div style="position:fixed">over</div>\n\n<!-- comment -->'
    )

    assert tags(html) == {"p"}
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&lt;b onclick=&quot;steal()&quot;&gt;bold&lt;/b&gt;" in html
    assert "&lt;iframe src=&quot;https://e.com&quot;&gt;" in html
    assert "&lt;div style=&quot;position:fixed&quot;&gt;over&lt;/div&gt;" in html
    assert "&lt;!-- comment --&gt;" in html


@pytest.mark.parametrize("url", [
    "javascript:alert(1)",
    "JavaScript:alert(1)",
    " javascript:alert(1)",
    "java&#115;cript:alert(1)",
    "&#106;avascript:alert(1)",
    "vbscript:msgbox(1)",
    "data:text/html,<script>alert(1)</script>",
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "file:///etc/passwd",
    "/admin/",
    "//evil.example/x",
    "#top",
])
def test_links_other_than_http_and_mailto_stay_text(url):
    html = markdown_render(f"[click]({url}) and <{url}> and [ref][r]\n\n[r]: {url}")

    assert hrefs(html) == []
    assert "<a" not in html


def test_http_https_and_mailto_links_get_nofollow_noopener_noreferrer():
    html = markdown_render("[site](https://example.com/a?b=1&c=2) <http://example.org> <maria@example.com>")

    assert hrefs(html) == ["https://example.com/a?b=1&amp;c=2", "http://example.org", "mailto:maria@example.com"]
    assert html.count('rel="nofollow noopener noreferrer"') == 3


def test_a_link_title_cannot_break_out_into_an_attribute():
    html = markdown_render('[x](https://example.com "t\\" onmouseover=\\"alert(1)")')

    assert re.findall(r"<a [^>]*>", html) == [
        '<a href="https://example.com" title="t&quot; onmouseover=&quot;alert(1)" '
        'rel="nofollow noopener noreferrer">'
    ]


def test_images_load_nothing_and_show_their_alt_text_as_a_link():
    html = markdown_render(
        '![the *churn* chart](https://example.com/chart.png "t") ![](https://example.com/x.png) '
        "![tracker](javascript:alert(1)) ![pixel](data:image/png;base64,iVBORw0KGgo=)"
    )

    assert "<img" not in html and "src=" not in html
    assert ('<a href="https://example.com/chart.png" class="md-image" rel="nofollow noopener noreferrer">'
            "Image: the churn chart</a>") in html
    assert ">Image: https://example.com/x.png</a>" in html
    assert hrefs(html) == ["https://example.com/chart.png", "https://example.com/x.png"]
    assert "![tracker](javascript:alert(1))" in html


def test_text_is_escaped_as_django_escapes_it():
    text = "Say \"hi\" & it's <fine> {{ request.user.password }} {% debug %}"

    assert markdown_render(text) == f"<p>{escape(text)}</p>\n"


def test_the_sanitiser_still_holds_if_the_parser_let_raw_html_through(monkeypatch):
    # Defence in depth: with the parser's raw-HTML switch on by mistake, nh3 still strips it.
    monkeypatch.setitem(markdown._PARSER.options, "html", True)

    html = markdown_render(
        '<script>alert(1)</script><img src=x onerror="alert(1)"><a href="javascript:alert(1)" '
        'onclick="alert(1)" style="color:red" class="x">a</a><div id="d">d</div><a href="/admin/">rel</a>'
    )

    assert "<script" not in html and "alert(1)" not in html
    assert "<img" not in html and "onerror" not in html and "onclick" not in html and "style" not in html
    assert "<div" not in html and 'id="' not in html and 'class="x"' not in html
    assert hrefs(html) == []


def test_a_linked_image_is_one_link_labelled_with_the_image():
    html = str(markdown_render("[![the chart](https://img.example/x.png)](https://example.com/report)"))
    assert html == ('<p><a href="https://example.com/report" rel="nofollow noopener noreferrer">'
                    "Image: the chart</a></p>\n")
