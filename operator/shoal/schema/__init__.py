"""What the resource models are made of, below both `shoal.api` and
`shoal.planner`, importing neither: camelCase JSON names with Kubernetes'
acronyms (`model`) and Kubernetes quantities as exact numbers (`quantity`)."""
