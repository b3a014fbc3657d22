"""Speculative decoding: prompt-lookup and MTP drafts, verified through a small decode interface."""
