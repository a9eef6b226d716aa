"""llmfleet infrastructure: the Pulumi program and pure Kubernetes manifest renderers."""
