"""Emulated clouds for tests and the demo (filled in by the emulator module)."""
