"""Recurrent (SSM) state of hybrid models: its codec, transfer and replay."""
