"""Benchmarks: numbers for the closing notes, never timed tests."""
