"""The operator: VLLMCluster -> TP-group StatefulSets, a router, and status.

Three layers (see CONVENTIONS.md): the API (`shoal.api`) parses and validates
the spec; the pure modules here take plain data and return manifests or
decisions; the I/O modules carry them out, driven by kopf handlers that
`shoal operator` runs.

Pure (no I/O, and no kopf, aiohttp, httpx or kr8s loaded by importing them):
builders `engine`, `router`, `services`, `desired` (with `identity`, `names`,
`placement`, `pods` and `mounts`; `cache`: the model cache's claim and Job); decisions
`observe` (listed objects -> facts), `decide`
(facts -> actions, with `rollout`: deadlines and rollbacks) and `status`
(facts and actions -> status), with `restarts` and `failures` (containers'
states -> why, and what to do), `events` (the Events shoal posts), and
`autoscale` (the routers' demand -> replicas), `retire` (which
replicas a fleet keeps: the cheapest to lose go first), `enginekeys` (the
engines' API key digest on their templates, so a rotated key rolls out) and
`election` (when an operator may take the Lease that lets one act at a time).

I/O: `kube` (the API server), `probes`, `healthloop` and `warming` (the
engines), `autoscaler` (reads the routers, sets the scale subresource),
`reconcile` (one pass: read, decide, act), `crashlogs` (the logs of
engines' crashed runs, read once each), `recorder` (posts Events),
`finalizer` (takes shoal's finalizer off where kopf cannot),
`downloads` (the model cache's Job and claim), `handlers` (kopf),
`context`, `children` (the watched children), `metrics` and `logs`
(process state), `login` (kopf's credentials), `lease` (holds the Lease)
and `leading` (runs kopf only while it is held), `cli` (`shoal operator`).

tests/unit/test_layers.py holds every module of the package to this list."""
