"""`llmfleet simulate`: a discrete-event what-if of the whole fleet under a load trace, in simulated time."""
