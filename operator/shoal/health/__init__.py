"""Health of a replica as the operator sees it: what `/health` cannot show.

A hung vLLM engine keeps answering `/health` 200 while every request hangs
(see the fixtures README), so the operator also sends a canary completion
under a deadline and watches the token counters for progress."""
