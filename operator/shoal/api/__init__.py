"""The VLLMCluster resource: pydantic models of its spec and status (the single
source of truth), its validation, and the CRD generated from them.

Modules: `spec`, `status`, `resource` (the whole object), `capacity` (a spec
as the planner's inputs, and its plan), `validation` (errors that name the
field and the fix), `cel` (cross-field rules the API server enforces), `crd`
(the generated CustomResourceDefinition) and `cli` (`shoal crd`). Built on
`shoal.schema` (camelCase naming, quantities) and `shoal.planner`, which
import nothing of it."""

GROUP = "serving.shoal.dev"
VERSION = "v1alpha1"
KIND = "VLLMCluster"
PLURAL = "vllmclusters"
SINGULAR = "vllmcluster"
SHORT_NAMES = ("vlc",)
API_VERSION = f"{GROUP}/{VERSION}"
