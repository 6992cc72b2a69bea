# One image for the operator, the routers, the simulator and `helm test`:
# the `shoal` subcommand picks the part. Build: docker build -t shoal .
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/shoal
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-compile . && rm -rf /opt/shoal/operator

# Non-root, matching the chart's runAsUser; nothing is written outside /tmp.
USER 10001:10001
ENTRYPOINT ["shoal"]
CMD ["--help"]
