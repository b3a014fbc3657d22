"""The llama.cpp adapter: the only package that imports llama_cpp.

Subpackages: `llama` (library, model, context, sampler), `session` (the turn and the GPU
window), `query`, `transfer`, `hybrid`, `spec`, `media`, `persist`; `build` assembles a
session from its parts. Import names from their modules; this package exports nothing. Its
settings records live in `kvmem.engine_settings`, which loads no llama_cpp.
"""
