"""Who writes: the actor a service records on its change rows, and the one text format that
names a writer on any row (a memory's or a fact's source_ref, a change's actor).

A writer reference is "<kind>:<value>", one of WRITER_KINDS:
    token:<prefix>            an API or MCP client's token ("token:ks_ab12cd")
    user:<username>           a person in the dashboard or the admin ("user:maria")
    event:<id>                the chat message a kin's turn was answering
    introspection_run:<id>    an introspection run
    consolidation_run:<id>    a consolidation run
    command:<name>            a management command ("command:create_demo")
A change written by a kin's turn names both, as its actor: "kin:<id> turn:<id>".
"""
import re
from dataclasses import dataclass

WRITER_KINDS = ("token", "user", "event", "introspection_run", "consolidation_run", "command")
REF_MAX_LENGTH = 200  # the source_ref and actor columns
_REF = re.compile(rf"^({'|'.join(WRITER_KINDS)}):(\S.*)$", re.DOTALL)


@dataclass(frozen=True)
class Actor:
    """Who writes: `label` is kept as text on the change row ("user:maria",
    "token:ks_ab12cd", "introspection_run:12"); `user` is linked when there is one."""

    label: str
    user: object = None


def writer_ref(kind: str, value: object) -> str:
    """The reference to one writer; an unknown kind or an empty value is a programming error."""
    text = str(value)
    if kind not in WRITER_KINDS or not text.strip():
        raise ValueError(f"not a writer reference: {kind!r}, {text!r}")
    return f"{kind}:{text}"[:REF_MAX_LENGTH]


def token_ref(token) -> str:
    return writer_ref("token", token.prefix)


def user_ref(user) -> str:
    return writer_ref("user", user.get_username())


def writer_ref_parse(text: str) -> tuple[str, str] | None:
    """(kind, value) of a writer reference, or None for any other text (an empty source_ref)."""
    match = _REF.match(text)
    return (match.group(1), match.group(2)) if match else None


def writer_ref_check(text: str) -> str:
    """`text` when it is empty or a writer reference; the services call it before storing one."""
    if text and writer_ref_parse(text) is None:
        raise ValueError(f"source_ref must be '<kind>:<value>' with a kind of {', '.join(WRITER_KINDS)}: {text!r}")
    return text[:REF_MAX_LENGTH]
