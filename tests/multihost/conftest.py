"""Multi-host tests: real agents in Linux network namespaces (root + iproute2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zmesh._wire.security import Keys, authorize, keygen, keygen_client

from _helpers import connected
from netns_cluster import NetnsCluster, available

REASON = available()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "multihost" in str(item.fspath):
            item.add_marker(pytest.mark.multihost)
            if REASON:
                item.add_marker(pytest.mark.skip(reason=f"multihost: {REASON}"))


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The agents' keys (every node holds them)."""
    path = tmp_path_factory.mktemp("keys") / "cluster"
    keygen(str(path))
    return str(path)


@pytest.fixture(scope="module")
def client_keys(keys_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The client's own keypair, authorised by the agents (it never holds their secret)."""
    path = str(tmp_path_factory.mktemp("keys") / "client")
    keys = keygen_client(path, Keys.load(keys_dir).public)
    authorize(keys_dir, keys.public, "client")
    return path


@pytest.fixture
def netns3(keys_dir: str, client_keys: str) -> Iterator[NetnsCluster]:
    """Three hosts, each a namespace with its own IP and a CURVE-keyed agent."""
    # Owner heartbeats cannot cross a cut link: give owners a grace longer than
    # the partitions these tests make, so the cut procs survive to be healed.
    with NetnsCluster(3, keys=keys_dir, env={"ZMESH_OWNER_GRACE": "15"}) as cluster:
        with connected(cluster.controls, keys=client_keys):
            yield cluster
