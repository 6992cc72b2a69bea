"""The router: a cache-aware, load-bounded, fault-tolerant OpenAI proxy in
front of a VLLMCluster's replicas."""
