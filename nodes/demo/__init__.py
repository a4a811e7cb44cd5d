"""Small random-weight demo models of every family, written in the file layouts users have."""
