"""Command-line and environment parsing shared by kvmem-server and kvmem-cli."""
