"""The pod runner: kubelet's part for a kwok cluster.

kwok marks pods Running but runs nothing. For every Running pod that a rule
maps to a command, the runner starts a local process (with the pod's env,
Secret and ConfigMap references resolved, in its own process group, pod IP in
the environment), restarts it per the pod's restartPolicy when it exits, with
kubelet's backoff, stops it when the pod terminates or goes, and starts a
fresh one for a new pod UID. The container's state goes to pods/status as
kubelet writes it (see `kubelet`): CrashLoopBackOff and the last exit,
ErrImagePull/ImagePullBackOff, CreateContainerConfigError, and the exit of a
pod that ran to completion. Each run's stdout and stderr go to a log file in
kubelet's CRI format, which kwok serves to `kubectl logs` (see `podlogs`). An
API server that goes away (a restart) only delays the reports: the processes
keep running.

Run as `python -m shoal_testbed.podrunner --kubeconfig K --log-dir D`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch

from shoal_testbed import kubelet, podfs, podlogs, procs
from shoal_testbed.podspec import Pod, container
from shoal_testbed.realnode import NODE_NAME
from shoal_testbed.rules import Launch, Rule

log = logging.getLogger("podrunner")

# What a call to the API server raises while it is down or restarting: the
# client's errors, and urllib3's (MaxRetryError, ProtocolError) for a refused
# or dropped connection, which are not OSErrors.
API_ERRORS = (OSError, client.ApiException, urllib3.exceptions.HTTPError)
# How often a running pod's ConfigMap and Secret volumes are brought up to
# date (kubelet: its sync period plus a cache TTL, about a minute; the
# testbed is quicker so tests of hot reloads stay short). A container waiting
# on a missing ConfigMap or Secret is retried as often.
_VOLUME_SYNC_SECONDS = 2.0
# After a status write the API server refused or could not take.
_REPORT_RETRY_SECONDS = 1.0
# After the pod's kwok Logs object could not be written.
_LOGS_RETRY_SECONDS = 2.0
# The API server ends each watch after this long; a read timeout past it
# catches a connection that went quiet without closing (a server that vanished
# without a FIN), which would otherwise hold the watch forever.
_WATCH_SECONDS = 60
_READ_TIMEOUT_SECONDS = (5, _WATCH_SECONDS + 30)


@dataclass
class Running:
    pod: Pod
    launch: Launch
    process: subprocess.Popen[bytes] | None
    state: kubelet.Container = field(init=False)
    volumes_synced_at: float = 0.0
    log_offset: int = 0  # where the current process's output starts in the log
    output: podlogs.Output | None = None  # copies the current process's output
    run: int = 0  # the current or last run (kubelet's restart count then)
    reported: dict[str, Any] | None = None  # the last status the API server took
    report_at: float = 0.0
    logs_published: bool = False  # kwok's Logs object for the pod is written
    logs_at: float = 0.0

    def __post_init__(self) -> None:
        meta = self.pod["metadata"]
        self.state = kubelet.Container(
            name=self.launch.container,
            image=self.launch.image,
            pod=f"{meta['name']}_{meta.get('namespace', '')}({meta['uid']})",
        )


def runnable(pod: Pod) -> bool:
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    return (
        not meta.get("deletionTimestamp")
        # The real node's kubelet runs its own pods (realnode.py).
        and pod.get("spec", {}).get("nodeName") != NODE_NAME
        and status.get("phase") == "Running"
        and bool(status.get("podIP"))
    )


def pod_key(pod: Pod) -> str:
    meta = pod["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _wall() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(pod: Pod, entry_state: kubelet.Container, *, now: float) -> dict[str, Any]:
    """pods/status as kubelet would write it for the container the runner
    plays; the pod's other containers keep what kwok wrote."""
    played = entry_state.status(now=now)
    known = {c.get("name"): c for c in pod.get("status", {}).get("containerStatuses") or []}
    statuses = [
        played if spec["name"] == played["name"] else known.get(spec["name"], {})
        for spec in pod.get("spec", {}).get("containers", [])
    ]
    status: dict[str, Any] = {
        "containerStatuses": [s for s in statuses if s],
        "conditions": [
            {"type": "ContainersReady", "status": "True" if played["ready"] else "False"}
        ],
    }
    if entry_state.terminated is not None:
        status["phase"] = "Succeeded" if entry_state.terminated["exitCode"] == 0 else "Failed"
    return {"status": status}


class PodRunner:
    def __init__(self, *, api: client.CoreV1Api, rules: Sequence[Rule], log_dir: Path) -> None:
        self.api = api
        self.rules = rules
        self.log_dir = log_dir
        self.pods: dict[str, Pod] = {}  # by UID, as last seen by the watch
        self.lock = threading.Lock()
        self.running: dict[str, Running] = {}  # by UID
        # Pods that ran to completion: their logs stay until the pod goes.
        self.completed: dict[str, Running] = {}  # by UID
        # Processes of deleted pods still stopping (draining), by pod IP: kwok
        # removes a pod at once and may give its IP to the next one, which a
        # real kubelet never lets run beside the pod it replaces.
        self.stopping: dict[str, subprocess.Popen[bytes]] = {}
        self.stop_event = threading.Event()
        self.synced = threading.Event()

    # ---- watch: keep self.pods equal to the API's pods
    def watch_forever(self) -> None:
        while not self.stop_event.is_set():
            try:
                # Raw JSON: rules read pods as the API writes them (camelCase).
                response: Any = self.api.list_pod_for_all_namespaces(
                    _preload_content=False, _request_timeout=_READ_TIMEOUT_SECONDS
                )
                listing = json.loads(response.data)
                with self.lock:
                    self.pods = {p["metadata"]["uid"]: p for p in listing["items"]}
                self.synced.set()
                version = listing["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.api.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=_WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                    _request_timeout=_READ_TIMEOUT_SECONDS,
                    # Plain JSON, as the listing: no V1Pod model per event
                    # (CPU the testbed's processes need more).
                    deserialize=False,
                )
                for event in stream:
                    if self.stop_event.is_set():
                        return
                    kind, raw = event["type"], event["object"]
                    if kind == "ERROR":
                        break  # e.g. 410 Gone: re-list
                    if kind == "BOOKMARK":
                        continue
                    with self.lock:
                        if kind == "DELETED":
                            self.pods.pop(raw["metadata"]["uid"], None)
                        else:
                            self.pods[raw["metadata"]["uid"]] = raw
            except Exception as error:
                log.warning("pod watch failed, re-listing: %s", error)
                time.sleep(1)

    # ---- supervise: converge processes on the pods
    def launch_for(self, pod: Pod) -> Launch | None:
        for rule in self.rules:
            launch = rule(pod)
            if launch is not None:
                return launch
        return None

    def supervise_once(self) -> None:
        with self.lock:
            wanted = {uid: pod for uid, pod in self.pods.items() if runnable(pod)}
            present = {
                uid
                for uid, pod in self.pods.items()
                if not pod["metadata"].get("deletionTimestamp")
            }
        for uid in list(self.running):
            if uid not in wanted:
                self._stop(uid, reason="pod terminating or gone", keep_logs=uid in present)
        for uid in list(self.completed):
            if uid not in present:
                self._forget_logs(self.completed.pop(uid))
        for uid, pod in wanted.items():
            entry = self.running.get(uid)
            if entry is None:
                launch = self.launch_for(pod)
                if launch is None:
                    continue
                entry = Running(pod=pod, launch=launch, process=None)
                self.running[uid] = entry
            entry.pod = pod
            # One pod's trouble (or the API server's) must not stop the others.
            try:
                self._advance(uid, entry)
                self._sync_volumes(entry)
                self._report(entry)
                self._publish_logs(entry)
            except Exception:
                log.exception("%s: supervising failed; trying again", pod_key(pod))

    def _advance(self, uid: str, entry: Running) -> None:
        """Move the container along: notice its exit, or try to start it when due."""
        state, now = entry.state, time.monotonic()
        if entry.process is not None:
            code = entry.process.poll()
            if code is not None:
                self._exited(entry, code)
            return
        if not state.due(now):
            return
        if kubelet.unpullable(entry.launch.image):
            state.pull_failed(now=now)
            log.info("%s: image %s cannot be pulled", pod_key(entry.pod), entry.launch.image)
            return
        self._start(uid, entry)

    def _exited(self, entry: Running, code: int) -> None:
        # What the process left behind goes with it, as a container's other
        # processes do when its first one exits; then its last words are copied.
        if entry.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry.process.pid, signal.SIGKILL)
        if entry.output is not None:
            entry.output.drain()
            entry.output = None
        policy = entry.pod.get("spec", {}).get("restartPolicy", "Always")
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        reason = kubelet.termination_reason(code)
        message = ""
        spec = container(entry.pod, entry.launch.container) or {}
        if code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = kubelet.log_message(self._log_since(entry))
        entry.process = None
        podlogs.end_run(self._container_dir(entry), entry.run, restarting=restart)
        entry.state.exited(
            code,
            reason=reason,
            message=message,
            restart=restart,
            wall=_wall(),
            now=time.monotonic(),
        )
        log.info(
            "%s: process exited with %d (%s, restartPolicy %s)%s",
            pod_key(entry.pod),
            code,
            reason,
            policy,
            f"; restarting in {entry.state.retry_at - time.monotonic():.0f}s" if restart else "",
        )

    def _log_since(self, entry: Running) -> str:
        try:
            with open(self._log_path(entry.pod), "rb") as log_file:
                log_file.seek(entry.log_offset)
                return log_file.read().decode(errors="replace")
        except OSError:
            return ""

    def _report(self, entry: Running) -> None:
        """Write the container's status when it changed, until the API server takes it."""
        now = time.monotonic()
        body = status_body(entry.pod, entry.state, now=now)
        if body == entry.reported or now < entry.report_at:
            return
        pod = entry.pod
        try:
            self.api.patch_namespaced_pod_status(
                pod["metadata"]["name"],
                pod["metadata"].get("namespace", ""),
                body,
                # The conditions merge by type; kwok's and the readiness gates stay.
                _content_type="application/strategic-merge-patch+json",
            )
        except API_ERRORS as error:
            log.warning("%s: status not reported, will retry: %s", pod_key(pod), error)
            entry.report_at = now + _REPORT_RETRY_SECONDS
            return
        entry.reported = body

    def _publish_logs(self, entry: Running) -> None:
        """Write the pod's kwok Logs object once its container has a log."""
        now = time.monotonic()
        if entry.logs_published or not entry.state.ever_started or now < entry.logs_at:
            return
        meta = entry.pod["metadata"]
        manifest = podlogs.logs_manifest(
            pod_name=meta["name"],
            namespace=meta.get("namespace", ""),
            pod_uid=meta["uid"],
            container=entry.launch.container,
            container_dir=self._container_dir(entry),
        )
        try:
            self._custom_objects().patch_namespaced_custom_object(
                podlogs.LOGS_GROUP,
                podlogs.LOGS_VERSION,
                manifest["metadata"]["namespace"],
                podlogs.LOGS_PLURAL,
                manifest["metadata"]["name"],
                manifest,
                field_manager="testbed-podrunner",
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except API_ERRORS as error:
            if not (isinstance(error, client.ApiException) and error.status == 404):
                log.warning("%s: logs not published, will retry: %s", pod_key(entry.pod), error)
                entry.logs_at = now + _LOGS_RETRY_SECONDS
                return
            # No Logs CRD (a testbed started before kwok served logs) or no
            # namespace (the pod goes with it): nothing to retry for.
            log.info("%s: logs not published: %s", pod_key(entry.pod), error.reason)
        entry.logs_published = True

    def _unpublish_logs(self, entry: Running) -> None:
        """Best effort: a Logs object left behind names files of a pod that is
        gone, and the next pod of that name overwrites it."""
        if not entry.logs_published:
            return
        meta = entry.pod["metadata"]
        try:
            self._custom_objects().delete_namespaced_custom_object(
                podlogs.LOGS_GROUP,
                podlogs.LOGS_VERSION,
                meta.get("namespace", ""),
                podlogs.LOGS_PLURAL,
                meta["name"],
            )
        except API_ERRORS as error:
            log.info("%s: logs object not deleted: %s", pod_key(entry.pod), error)

    def _custom_objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api.api_client)

    def _sync_volumes(self, entry: Running) -> None:
        now = time.monotonic()
        if (
            not entry.launch.mounts
            or entry.process is None
            or now - entry.volumes_synced_at < _VOLUME_SYNC_SECONDS
        ):
            return
        entry.volumes_synced_at = now
        try:
            changed = podfs.refresh(
                self.api, entry.pod, entry.launch.mounts, self._pod_root(entry.pod)
            )
        except API_ERRORS as error:
            log.warning("%s: volumes not refreshed: %s", pod_key(entry.pod), error)
            return
        if changed:
            log.info("%s: updated volumes %s", pod_key(entry.pod), ", ".join(changed))

    def _log_path(self, pod: Pod) -> Path:
        meta = pod["metadata"]
        return self.log_dir / f"{meta.get('namespace', '')}_{meta['name']}_{meta['uid'][:8]}.log"

    def _container_dir(self, entry: Running) -> Path:
        """Where the container's CRI log files are, as in kubelet's /var/log/pods."""
        meta = entry.pod["metadata"]
        pod_dir = f"{meta.get('namespace', '')}_{meta['name']}_{meta['uid']}"
        return self.log_dir / pod_dir / entry.launch.container

    def _pod_root(self, pod: Pod) -> Path:
        """Where the pod's ServiceAccount kubeconfig and volumes are written."""
        meta = pod["metadata"]
        return (
            self.log_dir.parent
            / "podfs"
            / f"{meta.get('namespace', '')}_{meta['name']}_{meta['uid'][:8]}"
        )

    def _start(self, uid: str, entry: Running) -> None:
        pod, launch, now = entry.pod, entry.launch, time.monotonic()
        before = self.stopping.pop(pod["status"]["podIP"], None)
        if before is not None and before.poll() is None:
            # Its pod is gone: it would answer for this one (a draining
            # engine still says /health 200). Cut its drain short.
            log.info("%s: killing pid %d, still stopping at this IP", pod_key(pod), before.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(before.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                before.wait(timeout=5)
        argv: list[str] = launch.argv
        extra: dict[str, str] = {}
        dropped: tuple[str, ...] = ()
        try:
            spec = container(pod, launch.container) or {}
            referenced = podfs.referenced_env(self.api, pod, spec)
            if launch.service_account is not None or launch.mounts:
                argv, extra, dropped = podfs.prepare(
                    self.api,
                    pod,
                    argv=launch.argv,
                    service_account=launch.service_account,
                    mounts=launch.mounts,
                    root=self._pod_root(pod),
                )
            argv = podfs.relocate_to_host(argv, podfs.host_mounts(self.api, pod, spec))
            env = {
                **{k: v for k, v in os.environ.items() if k not in dropped},
                **referenced,
                **launch.env,
                **extra,
                "SHOAL_POD_IP": pod["status"]["podIP"],
                "SHOAL_POD_NAME": pod["metadata"]["name"],
                "SHOAL_POD_NAMESPACE": pod["metadata"].get("namespace", ""),
                "SHOAL_POD_UID": uid,
            }
            log_path = self._log_path(pod)
            entry.log_offset = log_path.stat().st_size if log_path.exists() else 0
            entry.run = entry.state.next_run
            entry.process, entry.output = podlogs.start(
                argv,
                env=env,
                cri_path=podlogs.begin_run(self._container_dir(entry), entry.run),
                plain_path=log_path,
            )
        except podfs.ConfigError as error:
            log.warning("%s: CreateContainerConfigError: %s", pod_key(pod), error)
            entry.state.config_failed(
                f"Error: {error}", now=now, retry_seconds=_VOLUME_SYNC_SECONDS
            )
            return
        except API_ERRORS as error:
            log.error("%s: cannot start %s: %s", pod_key(pod), entry.launch.argv, error)
            entry.process = None
            entry.state.retry_at = now + _VOLUME_SYNC_SECONDS
            return
        entry.state.started(wall=_wall(), now=now)
        log.info(
            "%s (uid %s): started pid %d: %s",
            pod_key(pod),
            uid[:8],
            entry.process.pid,
            " ".join(argv),
        )

    def _stop(self, uid: str, *, reason: str, keep_logs: bool) -> None:
        """Stop the pod's process; keep_logs: the pod is still there (it ran
        to completion), so `kubectl logs` still shows its container's runs."""
        entry = self.running.pop(uid)
        shutil.rmtree(self._pod_root(entry.pod), ignore_errors=True)
        if keep_logs and entry.state.finished:
            self.completed[uid] = entry
        else:
            self._forget_logs(entry)
        if entry.process is not None and entry.process.poll() is None:
            log.info(
                "%s (uid %s): stopping pid %d: %s",
                pod_key(entry.pod),
                uid[:8],
                entry.process.pid,
                reason,
            )
            process = entry.process
            ip = entry.pod.get("status", {}).get("podIP")
            if ip:
                self.stopping[ip] = process

            # Stop in the background: a slow process must not hold up the others.
            def reap() -> None:
                procs.stop_group(process.pid)
                process.wait()
                if ip and self.stopping.get(ip) is process:
                    del self.stopping[ip]

            threading.Thread(target=reap, daemon=True).start()

    def _forget_logs(self, entry: Running) -> None:
        self._unpublish_logs(entry)
        shutil.rmtree(self._container_dir(entry).parent, ignore_errors=True)

    def stop_all(self) -> None:
        self.stop_event.set()
        for uid in list(self.running):
            entry = self.running.pop(uid)
            if entry.process is not None and entry.process.poll() is None:
                procs.stop_group(entry.process.pid)


def load_rules(spec: str) -> Sequence[Rule]:
    module_name, _, attr = spec.partition(":")
    rules: Sequence[Rule] = getattr(importlib.import_module(module_name), attr)
    return rules


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="shoal_testbed.podrunner", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument(
        "--rules",
        default="shoal_testbed.rules:DEFAULT_RULES",
        help="module:attribute naming a sequence of rules",
    )
    parser.add_argument(
        "--ready-file", type=Path, help="touched once the first pod listing has been read"
    )
    parser.add_argument("--interval-seconds", type=float, default=0.1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    api = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    runner = PodRunner(api=api, rules=load_rules(args.rules), log_dir=args.log_dir)

    def terminate(signum: int, _frame: object) -> None:
        runner.stop_event.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    threading.Thread(target=runner.watch_forever, daemon=True).start()
    while not runner.synced.wait(0.1):
        if runner.stop_event.is_set():
            return
    if args.ready_file:
        args.ready_file.touch()
    log.info("pod runner watching pods")
    try:
        while not runner.stop_event.is_set():
            runner.supervise_once()
            runner.stop_event.wait(args.interval_seconds)
    finally:
        runner.stop_all()
        log.info("pod runner stopped")


if __name__ == "__main__":
    main()
