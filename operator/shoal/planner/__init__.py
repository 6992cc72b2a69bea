"""The capacity planner: before anything starts, what a layout of GPUs gives.

Pure arithmetic over a model's architecture, a GPU and a layout (TP, PP, DP,
DCP); `shoal plan` prints it and the operator writes it to `status.capacity`.
Modules: `architecture` and `presets` (the model), `layout`, `plan` (the
arithmetic and vLLM's rules), `result` (the output model), `from_spec` (a
VLLMCluster's inputs), `table` and `cli` (`shoal plan`)."""
