"""A loop's state: the receipt kinds and their facts, the projection's rows, the fold that applies a receipt and the judge that asks whether its decision was legal."""
