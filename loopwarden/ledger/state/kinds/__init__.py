"""The receipt kinds, by family: each kind's fold step, judge rule and spec, side by side."""
