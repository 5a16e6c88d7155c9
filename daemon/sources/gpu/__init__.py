"""GPU sources: NVML, the deadline guard around any source, and the null source."""
