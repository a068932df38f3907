"""Outputs: llama.cpp-layout console text and JSON."""
