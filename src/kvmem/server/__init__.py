"""kvmem-server: the OpenAI-compatible HTTP server (`kvmem.server.app.create_app`,
`kvmem.server.main.main`)."""
