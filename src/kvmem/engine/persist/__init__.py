"""Sessions and slots on disk: manifests, conversation files, slot save/restore."""
