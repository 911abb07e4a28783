"""One stack per deployable unit of a stage."""
