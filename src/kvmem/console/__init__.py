"""The console scripts that run llama.cpp: kvmem-cli's chat loop and kvmem-rpc-worker.

Their flags are parsed and checked by `kvmem.cli` (which imports no `kvmem.engine`); the
modules here join that flag layer to the engine that loads the model or serves ggml-rpc.
"""
