"""Todos: the work items of a loop, added and cancelled; their receipt kinds."""
