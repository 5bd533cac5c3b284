"""The load clients' manners: when they start, and how long each waits after a refusal."""

from __future__ import annotations

from qkan_pack.bench._load import _pushback, _retry_after

from ._stub import stub_server


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


def test_every_client_starts_at_one_moment_and_its_cpu_counts_every_request_sent() -> None:
    """Clients sent from the moment their thread started, up to a second before the others
    and before their processes' CPU was read: about a third of the requests counted in
    ``sent`` had no CPU counted (a stub server saw 86 of 224 before the start). Now none
    arrives before the start, and the clients' CPU is spread over requests it paid for."""
    import time

    from qkan_pack.bench._load import LoadSpec, RowInput, run_load

    arrivals: list[float] = []

    with stub_server(lambda: arrivals.append(time.time())) as port:
        called = time.time()
        result = run_load(LoadSpec(host="127.0.0.1", port=port, clients=2, seconds=0.3,
                                   warmup=0.1, rows=(RowInput("x", (2,)),)), 1)
    # run_load starts every client one second after it is called (the processes spawn)
    assert arrivals and min(arrivals) >= called + 0.9, min(arrivals) - called
    assert result.sent == len(arrivals) and result.cpu_s > 0
