"""Markdown to safe HTML for the dashboard (the experience document): the text is written
by a model from facts that users and agents wrote, so it is hostile input. Three layers:
markdown-it-py parses with raw HTML off and only http(s)/mailto links; nh3 (ammonia)
keeps an allow-list of tags and attributes; the result is written out once more with
Django's escaping, so text reads exactly as on every other dashboard page."""
from html.parser import HTMLParser

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

LINK_SCHEMES = ("http://", "https://", "mailto:")
LINK_REL = "nofollow noopener noreferrer"
ALLOWED_TAGS = {
    "h1", "h2", "h3", "h4", "h5", "h6", "p", "br", "hr", "blockquote", "ul", "ol", "li",
    "strong", "em", "del", "s", "code", "pre", "a", "table", "thead", "tbody", "tr", "th", "td",
}
# No style, class (but the image marker), id or event attributes ("*": none on every tag);
# nh3 adds rel to every link.
ALLOWED_ATTRIBUTES = {"*": set(), "a": {"href", "title"}, "ol": {"start"}}
ALLOWED_CLASSES = {"a": {"md-image"}}


def _is_allowed_link(url: str) -> bool:
    # Relative links are refused too: a document has no business pointing into the dashboard.
    return url.strip().lower().startswith(LINK_SCHEMES)


def _image_as_link(renderer, tokens, idx, options, env) -> str:
    """An image loads nothing: it shows as a link to the picture, labelled with its alt text."""
    token = tokens[idx]
    src = token.attrGet("src") or ""
    label = renderer.renderInlineAsText(token.children or [], options, env) or src
    opened = sum(1 if t.type == "link_open" else -1 for t in tokens[:idx] if t.type in ("link_open", "link_close"))
    if opened > 0:  # inside a link already (a linked image): a link cannot hold another
        return escapeHtml("Image: " + label)
    return f'<a href="{escapeHtml(src)}" class="md-image">{escapeHtml("Image: " + label)}</a>'


def _parser() -> MarkdownIt:
    parser = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    # A link or image whose URL fails this stays as its literal Markdown text.
    parser.validateLink = _is_allowed_link
    parser.add_render_rule("image", _image_as_link)
    return parser


_PARSER = _parser()


class _Reserialiser(HTMLParser):
    """Writes nh3's (well-formed, allow-listed) output again with Django's escape: nh3 leaves
    quotes in text unescaped, which is harmless but reads unlike the rest of the dashboard."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = "".join(f' {name}="{escape(value or "")}"' for name, value in attrs)
        self.parts.append(f"<{tag}{attributes}>")

    def handle_endtag(self, tag):
        self.parts.append(f"</{tag}>")

    def handle_data(self, data):
        self.parts.append(escape(data))


def markdown_render(text: str) -> SafeString:
    """`text` (Markdown) as HTML that is safe to put into a page as it is."""
    cleaned = nh3.clean(
        _PARSER.render(text),
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        allowed_classes=ALLOWED_CLASSES,
        url_schemes={"http", "https", "mailto"},
        url_relative="deny",
        link_rel=LINK_REL,
        strip_comments=True,
    )
    writer = _Reserialiser()
    writer.feed(cleaned)
    writer.close()
    return mark_safe("".join(writer.parts))  # every part was escaped above
