"""The router's pod discovery against a stand-in API server on loopback: the
fleet is the list, then follows the watch (a pod turning Ready, a pod
deleted); an expired watch (410) leads to a fresh list that replaces the
fleet; cancelling the watcher stops it. The real API server's version of this
is tests/e2e/test_router_discovery.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from shoal import __version__
from shoal.router.discovery import PodWatcher
from shoal.router.fleet import Endpoint
from tests.integration.fake_apiserver import fake_apiserver

PODS = "/api/v1/namespaces/team/pods"


def pod(name: str, *, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "namespace": "team"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def listing(*pods: dict[str, Any], version: str) -> tuple[int, Any]:
    return 200, {"metadata": {"resourceVersion": version}, "items": list(pods)}


def test_the_fleet_follows_the_pod_watch_and_a_fresh_list_after_it_expires(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with fake_apiserver(tmp_path) as server:
            published: asyncio.Queue[dict[str, bool]] = asyncio.Queue()

            def publish(endpoints: list[Endpoint]) -> None:
                published.put_nowait({e.name: e.routable for e in endpoints})

            async def fleet() -> dict[str, bool]:
                return await asyncio.wait_for(published.get(), 10)

            server.answers[("GET", PODS)] = listing(pod("a", ready=True), version="5")
            first: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
            server.watches.put_nowait(first)
            watcher = PodWatcher(
                namespace="team",
                selector="app=eng",
                engine_port=8000,
                publish=publish,
                kubeconfig=str(server.kubeconfig),
            )
            task = asyncio.create_task(watcher.run())
            assert await fleet() == {"a": True}

            first.put_nowait({"type": "ADDED", "object": pod("b", ready=False)})
            assert await fleet() == {"a": True, "b": False}
            first.put_nowait({"type": "BOOKMARK", "object": {"metadata": {}}})
            first.put_nowait({"type": "MODIFIED", "object": pod("b", ready=True)})
            assert await fleet() == {"a": True, "b": True}
            first.put_nowait({"type": "DELETED", "object": pod("a", ready=True)})
            assert await fleet() == {"b": True}

            # The watch expires; the list now says only c exists.
            server.answers[("GET", PODS)] = listing(pod("c", ready=True), version="9")
            second: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
            server.watches.put_nowait(second)
            gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
            first.put_nowait({"type": "ERROR", "object": gone})
            first.put_nowait(None)
            assert await fleet() == {"c": True}
            assert watcher.relists == 2

            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
            second.put_nowait(None)

            watches = [s for s in server.seen if s.query.get("watch") == "true"]
            assert [w.query["resourceVersion"] for w in watches] == ["5", "9"]
            for request in server.seen:
                assert request.query["labelSelector"] == "app=eng"
                assert request.headers["User-Agent"] == f"shoal-router/{__version__}"
            assert watches[0].query["allowWatchBookmarks"] == "true"

    asyncio.run(main())


def test_a_watch_gone_silent_is_given_up_and_the_pods_listed_again(tmp_path: Path) -> None:
    """A connection that died without a word (a partition, an API server
    moved) sends nothing, not even the end of the watch the server would have
    sent at its timeout: the router stops waiting soon after that timeout
    instead of being blind to pod changes for minutes."""

    async def main() -> None:
        async with fake_apiserver(tmp_path) as server:
            published: asyncio.Queue[dict[str, bool]] = asyncio.Queue()
            server.answers[("GET", PODS)] = listing(pod("a", ready=True), version="5")
            silent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
            server.watches.put_nowait(silent)  # answers its head, then nothing
            server.watches.put_nowait(asyncio.Queue())
            watcher = PodWatcher(
                namespace="team",
                selector="app=eng",
                engine_port=8000,
                publish=lambda endpoints: published.put_nowait(
                    {e.name: e.routable for e in endpoints}
                ),
                watch_timeout_seconds=2,
                kubeconfig=str(server.kubeconfig),
            )
            task = asyncio.create_task(watcher.run())
            assert await asyncio.wait_for(published.get(), 10) == {"a": True}
            server.answers[("GET", PODS)] = listing(pod("b", ready=True), version="7")
            try:
                assert await asyncio.wait_for(published.get(), 10) == {"b": True}
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                silent.put_nowait(None)
            assert watcher.relists == 2

    asyncio.run(main())
