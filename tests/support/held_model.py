"""A scripted model that holds its streamed reply part-way, so a test sees what a client
shows mid-reply without racing the reply."""
from __future__ import annotations

import threading

from tests.support.scripted_model import ScriptedProvider


class HeldProvider(ScriptedProvider):
    """Streaming, it stops after `hold_after` pieces of text until the test sets `release`
    (`held` is set once it waits)."""

    def __init__(self, *args, hold_after: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.hold_after = hold_after
        self.held = threading.Event()
        self.release = threading.Event()

    def chat(self, messages, *, on_delta=None, **kwargs):
        if on_delta is None:
            return super().chat(messages, **kwargs)
        sent = 0

        def hold_then_pass(piece: str) -> None:
            nonlocal sent
            on_delta(piece)
            sent += 1
            if sent == self.hold_after:
                self.held.set()
                assert self.release.wait(20), "the test never released the model"

        return super().chat(messages, on_delta=hold_then_pass, **kwargs)
