"""What a run records of where its numbers came from: the identities that make base files and
runs comparable (identity.py), the manifest of how they were computed (manifest.py), where a
model came from (model_ref.py) and its size in bytes and bits per weight (sizes.py)."""
