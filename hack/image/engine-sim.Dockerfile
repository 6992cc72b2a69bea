# shoal-engine-sim: NOT vLLM. The shoal image with a `vllm` entrypoint that
# runs `shoal sim` with vllm serve's arguments (hack/image/vllm), so the
# operator's engine pods run unchanged on nodes without GPUs or vLLM.
ARG SHOAL_IMAGE=localhost/shoal:dev
FROM ${SHOAL_IMAGE}
COPY --chmod=0755 hack/image/vllm /opt/shoal/venv/bin/vllm
LABEL org.opencontainers.image.title="shoal-engine-sim" \
      org.opencontainers.image.description="shoal's vLLM simulator behind a 'vllm serve' entrypoint; not vLLM"
ENTRYPOINT ["vllm"]
CMD ["serve", "--help"]
