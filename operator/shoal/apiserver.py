"""Reaching the Kubernetes API server with kr8s, for every shoal process that
does (operator, router discovery, `shoal check`): the credentials and the user
agent. Why kr8s: see `shoal.controller.kube`.

Credentials: a kubeconfig if one is found ($KUBECONFIG, else ~/.kube/config),
else the pod's ServiceAccount. kr8s reads them again and retries on a 401, as
ServiceAccount tokens rotate."""

from __future__ import annotations

import logging
import warnings

import kr8s.asyncio

from shoal import __version__


def quiet_request_log() -> None:
    """httpx logs every request at INFO: a long-running process's log would be
    mostly its API calls. Warnings still show."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def user_agent(component: str) -> dict[str, str]:
    """Request headers naming the shoal component in the API server's audit log
    (kr8s would send its own name). Sent per request: kr8s rebuilds its
    session when it logs in again."""
    return {"User-Agent": f"shoal-{component}/{__version__}"}


async def connect(*, kubeconfig: str | None = None) -> kr8s.asyncio.Api:
    with warnings.catch_warnings():
        # kr8s warns about API server versions newer than it lists; shoal only
        # uses its transport and credentials, which do not depend on them.
        warnings.filterwarnings("ignore", message="Kubernetes version", category=UserWarning)
        return await kr8s.asyncio.api(kubeconfig=kubeconfig)
