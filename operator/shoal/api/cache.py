"""spec.model.cache: where downloaded weights are kept so that they are fetched
once per cluster (a shared volume the operator fills with a download Job
before the engines start) or once per node (a host directory the engines
download into), and restarts and rollouts find them there."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from shoal.schema.model import ApiModel
from shoal.schema.names import HostPath, ObjectName
from shoal.schema.quantity import Quantity

DEFAULT_NODE_CACHE_PATH = "/var/lib/shoal/models"


class SharedCache(ApiModel):
    """A ReadWriteMany PersistentVolumeClaim holding the model, filled once by a
    download Job (the shoal image's `shoal download`) before any engine starts,
    and mounted read-only by every engine pod, which loads it without the Hub."""

    claim_name: ObjectName | None = Field(
        default=None,
        description="An existing ReadWriteMany claim to use. Default: shoal makes "
        "<cluster>-models (size, storageClassName), deleted with the cluster.",
    )
    size: Quantity = Field(
        default="200Gi",
        description="Size of the claim shoal makes: the model's files and some room "
        "(Llama 3.1 8B is 16 GB, 70B 141 GB, 405B FP8 410 GB).",
    )
    storage_class_name: ObjectName | None = Field(
        default=None,
        description="StorageClass of the claim shoal makes; it must offer ReadWriteMany "
        "(NFS, CephFS, Filestore, EFS, Azure Files...). Default: the cluster's default class.",
    )
    backoff_limit: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Retries of the download Job before it counts as failed.",
    )


class NodeCache(ApiModel):
    """A directory on each node (a hostPath volume) used as the engines' Hugging
    Face cache: the first engine on a node downloads the model, later engines
    and restarted ones on that node load it from disk."""

    path: HostPath = Field(
        default=DEFAULT_NODE_CACHE_PATH,
        description="Absolute directory on the node (made if missing). Use a disk "
        "large enough for every model the node serves.",
    )


class ModelCache(ApiModel):
    """Keep the downloaded weights: exactly one of shared or node."""

    shared: SharedCache | None = Field(
        default=None, description="Once per cluster, on a ReadWriteMany volume."
    )
    node: NodeCache | None = Field(default=None, description="Once per node, in a host directory.")


class DownloadState(StrEnum):
    PENDING = "Pending"  # no Job yet, or its pod is not running
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"


class DownloadStatus(ApiModel):
    """The shared cache's download Job, and while it runs the bytes its pod
    reports (GET /progress on the pod's IP, read by the operator every few
    seconds; absent when the pod cannot be reached)."""

    job: str = Field(max_length=253, description="The download Job's name.")
    state: DownloadState = Field(description="Pending, Running, Complete or Failed.")
    attempts: int = Field(default=0, ge=0, description="Pods of the Job that failed.")
    bytes: int | None = Field(
        default=None, ge=0, description="Bytes of the model in the cache (earlier attempts too)."
    )
    total_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of the model's files (excluded files not counted)."
    )
    bytes_per_second: int | None = Field(
        default=None, ge=0, description="This attempt's download rate."
    )
    progress: str | None = Field(
        default=None,
        max_length=256,
        description="Progress as a person reads it: '12.3 GiB of 140 GiB (8.8%), ~3 min left'.",
    )


class ModelStatus(ApiModel):
    """The model's weights: where the shared cache's download is."""

    download: DownloadStatus | None = Field(
        default=None, description="The download Job of spec.model.cache.shared, when set."
    )
