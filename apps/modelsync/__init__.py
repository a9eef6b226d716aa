"""`llmfleet model-sync`: S3 -> local NVMe model cache (init container)."""
