"""`shoal demo`: simulated engines behind the router, live, and the comparison."""
