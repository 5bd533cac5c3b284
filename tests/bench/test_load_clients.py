"""The load clients' manners: how long each waits after a refusal."""

from __future__ import annotations

from qkan_pack.bench._load import _pushback, _retry_after


class _RpcError(Exception):
    def __init__(self, trailing: tuple) -> None:
        self._trailing = trailing

    def trailing_metadata(self) -> tuple:
        return self._trailing


def test_a_grpc_client_waits_as_the_server_s_pushback_says() -> None:
    """gRPC's UNAVAILABLE carries ``grpc-retry-pushback-ms`` (gRFC A6) as HTTP's 503 carries
    ``Retry-After``: the bench's gRPC clients heed it as its HTTP clients heed the header
    (they retried after 50 ms, and so were refused about twenty times as often)."""
    assert _pushback(_RpcError((("grpc-retry-pushback-ms", "1000"),)), 0.05) == 1.0
    assert _pushback(_RpcError((("other", "7"),)), 0.05) == 0.05
    assert _pushback(_RpcError((("grpc-retry-pushback-ms", "-1"),)), 0.05) == 0.05
    assert _pushback(Exception(), 0.05) == 0.05
    assert _retry_after("1", 0.05) == 1.0 and _retry_after(None, 0.05) == 0.05
