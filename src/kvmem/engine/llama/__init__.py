"""The llama.cpp adapter proper: library handle, model, context, batches, sampler, native helpers."""
