"""Budget pools: a named budget across loops, defined, paused and resumed by operators and charged by every loop that draws from it."""
