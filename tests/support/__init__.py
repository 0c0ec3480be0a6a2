"""Shared test helpers: the fake OpenAI-compatible server (fake_openai), local servers and
connect/DNS guards for outbound fetches (outbound, with the no_real_dns fixture), and
ageing rows to move the clock on (clock)."""
