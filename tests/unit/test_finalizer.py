"""Releasing shoal's finalizer where kopf cannot (controller/finalizer.py):
the patch that takes only shoal's finalizer off, the refusal that says a
namespace is being deleted, and which namespaces the operator watches."""

from __future__ import annotations

import json

import pytest

from shoal.controller.context import ControllerSettings
from shoal.controller.finalizer import finalizer_patch
from shoal.controller.kube import NAMESPACE_TERMINATING, _status
from shoal.controller.names import FINALIZER


def test_the_patch_takes_only_shoals_finalizer_off_where_it_was_read() -> None:
    assert finalizer_patch(["other.example/keep", FINALIZER]) == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert finalizer_patch(["other.example/keep"]) is None
    assert finalizer_patch([]) is None


def test_a_create_refused_in_a_namespace_being_deleted_carries_its_cause() -> None:
    # As kube-apiserver answers (NamespaceLifecycle admission).
    refusal = {
        "kind": "Status",
        "status": "Failure",
        "message": 'statefulsets.apps "chat-r0" is forbidden: unable to create new content '
        "in namespace team-a because it is being terminated",
        "reason": "Forbidden",
        "details": {
            "name": "chat-r0",
            "group": "apps",
            "kind": "statefulsets",
            "causes": [
                {
                    "reason": NAMESPACE_TERMINATING,
                    "message": "namespace team-a is being terminated",
                    "field": "metadata.namespace",
                }
            ],
        },
        "code": 403,
    }
    message, causes = _status(json.dumps(refusal))
    assert message.endswith("because it is being terminated")
    assert causes == (NAMESPACE_TERMINATING,)
    assert _status(json.dumps({"message": "quota exceeded"})) == ("quota exceeded", ())
    assert _status("<html>bad gateway</html>") == ("<html>bad gateway</html>", ())


@pytest.mark.parametrize(
    ("patterns", "namespace", "watched"),
    [
        ((), "anything", True),
        (("team-a",), "team-a", True),
        (("team-a",), "team-b", False),
        (("team-*",), "team-b", True),
        (("team-*, !team-x",), "team-x", False),
        (("team-*", "ml"), "ml", True),
    ],
)
def test_the_operator_watches_the_namespaces_kopf_does(
    patterns: tuple[str, ...], namespace: str, watched: bool
) -> None:
    settings = ControllerSettings(router_image="router:1", namespaces=patterns)
    assert settings.watches(namespace) is watched
