"""Small CPU collectives (gloo tensors, never pickles) through which the ranks agree."""
