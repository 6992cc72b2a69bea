# One image for the operator, the routers, the simulator and `helm test`:
# the `shoal` subcommand picks the part. Build: `make image` (buildah or
# podman; hack/image/build.sh), or docker build -t shoal .
#
# BASE is any image with Python 3.11 and `python3 -m venv`: by default the
# public slim image users pull; where no registry is reachable (the testbed,
# CI) hack/image/build.sh passes a base it built from Debian packages.
ARG BASE=docker.io/library/python:3.11.11-slim-bookworm
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/shoal/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# A CA bundle for pip behind a TLS-intercepting proxy (mounted at build time
# by hack/image/build.sh, never stored in the image); empty: pip's own.
ARG PIP_CERT=
WORKDIR /opt/shoal
COPY pyproject.toml README.md ./
COPY operator ./operator
# The bench extra: `shoal demo` and `shoal bench` run in the image too; the tracing
# extra: a router with spec.router.tracing.otlpEndpoint set exports its spans.
RUN if [ -n "$PIP_CERT" ]; then export PIP_CERT; else unset PIP_CERT; fi \
    && python3 -m venv /opt/shoal/venv \
    && pip install --disable-pip-version-check '.[bench,tracing]' \
    && rm -rf /opt/shoal/operator /opt/shoal/build /opt/shoal/*.egg-info
# pip compiles the bytecode here (no --no-compile): the root filesystem is
# read-only in a pod, so a process could never cache it, and each start
# (operator, router, engine sim) would compile every module again (~2.5x the
# CPU of `shoal operator --help`). The base's standard library has its own.

# Non-root, matching the chart's runAsUser; nothing is written outside /tmp,
# so the root filesystem can be mounted read-only. The user has a passwd entry:
# kopf names the operator's peering identity by getpass.getuser(), which fails
# for a uid without one.
RUN echo 'shoal:x:10001:10001:shoal:/tmp:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'shoal:x:10001:' >> /etc/group
ENV HOME=/tmp
USER 10001:10001
ENTRYPOINT ["shoal"]
CMD ["--help"]
