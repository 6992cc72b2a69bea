"""OpenTelemetry traces of the router's requests (W3C trace context).

Each request is a SERVER span, a child of the client's `traceparent` when it
sent one; under it a span for waiting in the admission queue, one for each
routing decision (the chosen replica, the policy's reason, the predicted
cache hit) and a CLIENT span for each upstream attempt, whose context is the
`traceparent` the engine gets (vLLM started with `--otlp-traces-endpoint`
makes its own spans children of it).

Off (no `tracing.otlpEndpoint`), nothing here runs: the proxy holds no
`Tracing` and passes the client's trace headers on as they came, at the cost
of a None check per step. The `opentelemetry` packages are the optional
`tracing` extra, imported only when tracing is on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from shoal.api.router import RouterTracing
    from shoal.router.incoming import Incoming
    from shoal.router.policy import Choice

SERVICE_NAME = "shoal-router"


class Attempt:
    """One upstream attempt as the proxy sees it: the header lines carrying
    its trace context, and where its answer's status goes."""

    __slots__ = ("header", "span")

    def __init__(self, header: bytes = b"", span: Span | None = None) -> None:
        self.header = header
        self.span = span

    def answered(self, status: int) -> None:
        if self.span is not None:
            self.span.set_attribute("http.response.status_code", status)

    # A context manager, so the untraced path is one shared object.
    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, *_: object) -> None:
        return None


NOT_TRACED = Attempt()


class Tracing:
    """The router's tracer and the W3C propagator."""

    def __init__(self, tracer: Tracer, *, provider: TracerProvider | None = None) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.provider = provider  # one this module made, to flush at shutdown
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_settings(cls, settings: RouterTracing) -> Tracing | None:
        """Tracing exported over OTLP/HTTP as `settings` say, or None when off."""
        if settings.otlp_endpoint is None:
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        except ImportError as error:
            raise SystemExit(
                "tracing.otlpEndpoint is set but OpenTelemetry is not installed: "
                "pip install 'shoal[tracing]'"
            ) from error
        provider = TracerProvider(
            resource=Resource.create({"service.name": SERVICE_NAME}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        # Spans are exported from the processor's own thread, in batches:
        # the event loop only queues them.
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
        )
        return cls(provider.get_tracer("shoal.router"), provider=provider)

    @classmethod
    def on(cls, provider: TracerProvider) -> Tracing:
        """Tracing into a provider the caller owns (tests: an in-memory exporter)."""
        return cls(provider.get_tracer("shoal.router"))

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()

    @contextmanager
    def request(self, request: Incoming, request_id: str) -> Iterator[Attempt]:
        """The request's span, current while the request is handled (its
        children find it through the task's context); the Attempt it yields
        takes the answer's status."""
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(carrier=_Carrier(request))
        with self.tracer.start_as_current_span(
            f"{request.method} {request.path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": request.method,
                "url.path": request.path,
                "shoal.request_id": request_id,
            },
        ) as span:
            yield Attempt(span=span)

    @contextmanager
    def queued(self) -> Iterator[None]:
        """Waiting in the admission queue for a replica below saturation."""
        with self.tracer.start_as_current_span("router.queue"):
            yield

    def routed(
        self, choice: Choice, *, replica: str, policy: str, attempt: int, since: float
    ) -> None:
        """A routing decision for `replica` (its name) that took from `since`
        (perf_counter) to now."""
        took = time.perf_counter() - since
        end = time.time_ns()
        span = self.tracer.start_span(
            "router.route",
            start_time=end - int(took * 1e9),
            attributes={
                "shoal.replica": replica,
                "shoal.route.reason": choice.reason,
                "shoal.route.policy": policy,
                "shoal.route.predicted_hit": choice.predicted_hit,
                "shoal.attempt": attempt,
            },
        )
        span.end(end_time=end)

    @contextmanager
    def attempt(self, replica: str, *, attempt: int) -> Iterator[Attempt]:
        """One upstream attempt: a CLIENT span whose context the engine gets."""
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span(
            "router.upstream",
            kind=SpanKind.CLIENT,
            attributes={"shoal.replica": replica, "shoal.attempt": attempt},
        ) as span:
            carrier: dict[str, str] = {}
            self.propagator.inject(carrier)
            header = b"".join(
                b"%s: %s\r\n" % (name.encode(), value.encode("latin-1", "replace"))
                for name, value in carrier.items()
            )
            yield Attempt(header, span)


class _Carrier(dict[str, Any]):
    """A client's trace headers, as the propagator reads them."""

    def __init__(self, request: Incoming) -> None:
        super().__init__()
        for name in ("traceparent", "tracestate"):
            value = request.headers.get(name)
            if value is not None:
                self[name] = value
