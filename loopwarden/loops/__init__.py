"""Loops: opened by an operator, paused, resumed, cancelled, and closed by their stop rules; the loop kinds of the journal."""
