"""A loop's state as agents and operators read it: the projection, the loop list and who must act next."""
