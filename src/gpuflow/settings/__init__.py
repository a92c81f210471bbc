"""Config files, their JSON schemas (shipped in schemas/), defaults and config-doc."""
