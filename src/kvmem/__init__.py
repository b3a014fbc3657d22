"""KVMem: a tiered KV-cache memory for long-running LLM agents, on llama.cpp."""

__version__ = "0.1.0"
