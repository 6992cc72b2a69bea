"""The capacity planner: before anything starts, what a layout of GPUs gives.

Pure arithmetic over a model's architecture, a GPU and a layout (TP, PP, DP,
DCP); `shoal plan` prints it and the operator writes it to `status.capacity`.
Modules: `architecture` and `presets` (the model), `layout`, `plan` (the
arithmetic and vLLM's rules), `result` (the output model), `table` and `cli`
(`shoal plan`).

The layer below `shoal.api`: nothing here but `cli` (the top, reading
VLLMCluster manifests for `shoal plan -f`) imports it; a VLLMCluster's spec
becomes planner inputs in `shoal.api.capacity`."""
