"""The operator: VLLMCluster -> TP-group StatefulSets, a router, and status.

Three layers (see CONVENTIONS.md): the API (`shoal.api`) parses and validates
the spec; pure builders here return manifests (`engine`, `router`,
`services`, `desired`) and pure decisions return actions (`observe`,
`decide`, `status`); thin I/O modules apply them (`kube`, `probes`,
`reconcile`), driven by kopf handlers (`handlers`) that `shoal operator`
(`cli`) runs."""
