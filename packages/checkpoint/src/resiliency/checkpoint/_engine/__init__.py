"""The single-root engine and the save pipeline every engine shares (plan, stage, commit)."""
