"""Pure renderers: stack spec + sizing in, Kubernetes object dicts out."""
