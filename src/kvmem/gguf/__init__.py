"""GGUF files read without llama.cpp: model paths, projector and NextN metadata (used by the CLI)."""
