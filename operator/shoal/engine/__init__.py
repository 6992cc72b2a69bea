"""Everything shoal knows about a vLLM engine, in one place.

- `endpoints`: the engine's paths and the shape of its error answers.
- `metrics`: vLLM's metric names (current and older spellings) and the one
  parser that turns a `/metrics` scrape into a `MetricsSnapshot`.
- `errors`: what can go wrong talking to an engine, as types.
- `client`: the one async engine client of the control plane (operator,
  `shoal probe`, `shoal warmup`, bench, demo).

The router's data path keeps its own tuned engine connections
(`router/upstream.py`); its scraper uses the parser here.
"""
