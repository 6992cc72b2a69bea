"""Warm-up gating: fill a new engine's prefix cache with the prompts its
fleet shares, and verify from its own counters that they are cached, before
it takes traffic."""
