module shoal.dev/hack/imageref

go 1.24

// The version kubelet v1.36 (hack/testbed/versions.env) builds with.
require github.com/distribution/reference v0.6.0

require github.com/opencontainers/go-digest v1.0.0 // indirect
