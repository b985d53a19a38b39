"""The policies `loopwarden demo` opens its three loops with (package data)."""
