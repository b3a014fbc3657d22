"""KV data movement between the GPU context and the host tiers: codec, copy, staging, profile."""
