"""loadgen: the measuring instrument. `run_load(LoadConfig) -> LoadReport` and `llmfleet loadgen`."""
