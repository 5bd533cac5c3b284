"""The Ray seam: every private Ray name serve relies on exists in the installed release,
and a release outside the supported range is refused before Ray starts."""

from __future__ import annotations

import inspect

import pytest

from qkan_pack.errors import ServeError
from qkan_pack.serve._ray_compat import SUPPORTED, check_ray

ray = pytest.importorskip("ray")


def test_the_private_ray_names_relied_on_exist() -> None:
    from ray import serve
    from ray._private import auto_init_hook, ray_constants
    from ray._raylet import Config

    check_ray()  # the installed release is supported
    assert "_blocking" in inspect.signature(serve._run).parameters
    assert callable(Config.initialize)
    assert isinstance(ray_constants.ENABLE_RAY_CLUSTER, bool)
    assert hasattr(auto_init_hook, "enable_auto_connect")
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    from qkan_pack.serve._ray_compat import HEAD_NODE_RESOURCE

    assert HEAD_NODE_RESOURCE == HEAD_NODE_RESOURCE_NAME
    assert isinstance(SERVE_CONTROLLER_NAME, str) and isinstance(SERVE_NAMESPACE, str)
    from ray.serve._private.client import ServeControllerClient
    from ray.serve._private.controller import ServeController
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeInstanceDetails

    # serve_status: serve.status() with a bound on the controller's answer
    assert "raise_if_no_controller_running" in inspect.signature(_get_global_client).parameters
    assert "self._controller.get_serve_instance_details.remote()" in inspect.getsource(
        ServeControllerClient.get_serve_details)
    assert callable(ServeController.get_serve_instance_details)
    assert callable(ServeInstanceDetails._get_status)


def test_the_haproxy_admin_socket_is_where_ray_puts_it() -> None:
    """``haproxy_admin_socket`` repeats Ray's own per-node path for HAProxy's socket (the
    ingress counts of ``/metrics`` are read there)."""
    from ray.serve._private import haproxy
    from ray.serve._private.constants import RAY_SERVE_HAPROXY_SOCKET_PATH

    source = inspect.getsource(haproxy)
    assert "socket_path=_per_node(RAY_SERVE_HAPROXY_SOCKET_PATH)" in source
    assert "return os.path.join(d, self._node_id, f)" in source
    assert RAY_SERVE_HAPROXY_SOCKET_PATH.endswith(".sock")


@pytest.mark.parametrize("version", ["2.59.1", "2.61.0", "3.0.0", "nightly"])
def test_another_ray_release_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                     version: str) -> None:
    monkeypatch.setattr(ray, "__version__", version)
    with pytest.raises(ServeError) as info:
        check_ray()
    assert f"Ray {version} is outside the supported range {SUPPORTED};" in str(info.value)
    assert "supported range 2.60.x; qkan-pack serve relies on internals" in str(info.value) \
        and "pip install 'ray[serve]==2.60.*'" in str(info.value)
