"""Issue #14 (protocol fidelity): what the official AG-UI / AI SDK v6 clients need to end in the
server's state, checked at the translator and session level on a real nats-server. The Node
check with the official npm packages is `test_protocol_clients.py`."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_verifiers_live_in_tests_not_in_product_code() -> None:
    """Item 10: the stream verifiers are test code; nothing in gateway/ imports them."""
    adapters = ROOT / "gateway" / "adapters"
    assert not (adapters / "agui_verify.py").exists()
    assert not (adapters / "aisdk_verify.py").exists()
    for path in (ROOT / "gateway").rglob("*.py"):
        text = path.read_text()
        assert "agui_verify" not in text and "aisdk_verify" not in text and "protocol_verify" not in text, path
