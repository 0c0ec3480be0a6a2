"""Who writes: the actor a service records on its change rows. It lives on the ground floor
because the tool machinery (kinsite.tools) carries one and every app's services take one."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    """Who writes: `label` is kept as text on the change row ("user:maria",
    "token:ks_ab12cd", "introspection_run:12"); `user` is linked when there is one."""

    label: str
    user: object = None
