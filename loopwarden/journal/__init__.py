"""The journal as readers see it: one line per receipt, and one receipt with its signature and inclusion proof."""
