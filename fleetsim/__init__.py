"""GPU performance model, emulated vLLM-compatible worker and the discrete-event fleet simulator."""
