"""Test doubles for things outside this repository (an LLM provider), real over loopback."""
