"""The object-store engine (fsspec): spool, upload, commit by marker, verified download."""
