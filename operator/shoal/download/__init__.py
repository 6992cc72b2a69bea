"""`shoal download`: a model's files from the Hugging Face Hub into a directory,
as the operator's download Job runs it to fill a shared model cache.

`hub` is the Hub's HTTP API (the file listing and each file's bytes); `cli`
the command, which skips files already complete, so a retried or repeated
download fetches only what is missing."""
