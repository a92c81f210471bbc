"""Config files, their JSON schemas (shipped in schemas/) and defaults."""
