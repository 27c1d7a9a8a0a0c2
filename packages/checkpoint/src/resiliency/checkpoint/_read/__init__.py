"""The one read path: a DCP reader that verifies every byte against the manifest as it reads."""
