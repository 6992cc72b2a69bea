"""The VLLMCluster resource: pydantic models of its spec and status (the single
source of truth), its validation, and the CRD generated from them.

Modules: `base` (camelCase naming), `quantity` (memory sizes), `spec`,
`status`, `resource` (the whole object), `validation` (errors that name the
field and the fix), `cel` (cross-field rules the API server enforces), `crd`
(the generated CustomResourceDefinition) and `cli` (`shoal crd`)."""

GROUP = "serving.shoal.dev"
VERSION = "v1alpha1"
KIND = "VLLMCluster"
PLURAL = "vllmclusters"
SINGULAR = "vllmcluster"
SHORT_NAMES = ("vlc",)
API_VERSION = f"{GROUP}/{VERSION}"
