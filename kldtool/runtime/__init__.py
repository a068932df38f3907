"""The process around a run: how its large buffers are allocated (memory.py), how progress is
shown on stderr (progress.py), and small atomic text and JSON outputs (small_files.py)."""
