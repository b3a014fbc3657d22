"""The turn: the KVMem session and the GPU window that is the only writer of residency."""
